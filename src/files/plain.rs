//! YAML plain (unquoted) scalars, as PyYAML reads them (YAML 1.1: `yes/no/on/off` are
//! booleans; YAML 1.2's dot-less floats such as `1e-5`, which OmegaConf also reads as
//! floats): the value one stands for, and whether a string can be written as one.
//! A leaf: the YAML parser reads with it and the renderer writes with it, so neither
//! needs the other.

use std::sync::LazyLock;

use regex::Regex;

use super::Scalar;

static INT: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^[-+]?(?:0|[1-9][0-9_]*)$").unwrap());
static HEX: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^0x[0-9a-fA-F_]+$").unwrap());
static OCT: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^0o[0-7_]+$").unwrap());
static FLOAT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[-+]?(?:[0-9][0-9_]*\.[0-9_]*(?:[eE][-+]?[0-9]+)?|\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?|[0-9][0-9_]*[eE][-+]?[0-9]+)$").unwrap()
});

/// The value of a plain (unquoted) scalar.
pub(crate) fn resolve(s: &str) -> Scalar {
    match s {
        "" | "~" | "null" | "Null" | "NULL" => return Scalar::Null,
        "true" | "True" | "TRUE" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => {
            return Scalar::Bool(true);
        }
        "false" | "False" | "FALSE" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => {
            return Scalar::Bool(false);
        }
        ".inf" | ".Inf" | ".INF" | "+.inf" | "+.Inf" | "+.INF" => {
            return Scalar::Float(f64::INFINITY);
        }
        "-.inf" | "-.Inf" | "-.INF" => return Scalar::Float(f64::NEG_INFINITY),
        ".nan" | ".NaN" | ".NAN" => return Scalar::Float(f64::NAN),
        _ => {}
    }
    if INT.is_match(s)
        && let Ok(i) = s.replace('_', "").parse::<i64>()
    {
        return Scalar::Int(i);
    }
    if HEX.is_match(s)
        && let Ok(i) = i64::from_str_radix(&s[2..].replace('_', ""), 16)
    {
        return Scalar::Int(i);
    }
    if OCT.is_match(s)
        && let Ok(i) = i64::from_str_radix(&s[2..].replace('_', ""), 8)
    {
        return Scalar::Int(i);
    }
    if FLOAT.is_match(s)
        && let Ok(x) = s.replace('_', "").parse::<f64>()
    {
        return Scalar::Float(x);
    }
    Scalar::Str(s.to_string())
}

/// Whether `s` can be written as a plain scalar and read back as the same string.
pub(crate) fn plain_safe(s: &str, in_flow: bool) -> bool {
    let Some(first) = s.chars().next() else {
        return false;
    };
    if s.trim() != s || s.contains(['\n', '\r', '\t']) {
        return false;
    }
    if "-?:,[]{}#&*!|>'\"%@`".contains(first) {
        return false;
    }
    if s.contains(": ") || s.contains(" #") || s.ends_with(':') {
        return false;
    }
    if in_flow && s.contains([',', '[', ']', '{', '}']) {
        return false;
    }
    matches!(resolve(s), Scalar::Str(ref r) if r == s)
}
