//! Writing one value as literal text in each format, keeping the old value's
//! quote style (and YAML boolean capitalisation) where it had one.

use super::plain::plain_safe;
use super::{CannotWrite, Format, Scalar, ScalarNode, Style};

/// A float as text every format reads back as a float: always a `.`, and an
/// explicit exponent sign (PyYAML only reads `1.0e+20`, not `1e20`).
pub(crate) fn float(x: f64) -> String {
    let s = format!("{x:?}");
    match s.split_once('e') {
        None => s,
        Some((m, e)) => {
            let m = if m.contains('.') {
                m.to_string()
            } else {
                format!("{m}.0")
            };
            let e = if e.starts_with('-') {
                e.to_string()
            } else {
                format!("+{e}")
            };
            format!("{m}e{e}")
        }
    }
}

pub(crate) fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn single_quoted(s: &str, double_the_quote: bool) -> Option<String> {
    if s.contains('\n') || s.contains('\r') {
        return None;
    }
    if s.contains('\'') {
        if double_the_quote {
            return Some(format!("'{}'", s.replace('\'', "''")));
        }
        return None;
    }
    Some(format!("'{s}'"))
}

fn python_string(s: &str, quote: char) -> String {
    let mut out = String::new();
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// `value` as literal text for `format`. `old` is the value being replaced
/// (its quote style is kept for strings); `in_flow` is true inside a YAML flow
/// collection, where `,[]{}` make a plain scalar unsafe.
pub(crate) fn literal(
    format: Format,
    value: &Scalar,
    old: Option<&ScalarNode>,
    in_flow: bool,
) -> Result<String, CannotWrite> {
    let old_style = old.map(|o| o.style).unwrap_or(Style::Plain);
    Ok(match (format, value) {
        (_, Scalar::Float(x)) if !x.is_finite() => {
            return Err(CannotWrite::NotFinite);
        }
        (_, Scalar::Int(i)) => i.to_string(),
        (_, Scalar::Float(x)) => float(*x),
        (Format::Python, Scalar::Bool(b)) => if *b { "True" } else { "False" }.to_string(),
        (Format::Yaml, Scalar::Bool(b)) => yaml_bool(*b, old),
        (_, Scalar::Bool(b)) => b.to_string(),
        (Format::Json, Scalar::Null) => "null".into(),
        (Format::Yaml, Scalar::Null) => "null".into(),
        (Format::Python, Scalar::Null) => "None".into(),
        (Format::Toml, Scalar::Null) => {
            return Err(CannotWrite::TomlNull);
        }
        (Format::Json, Scalar::Str(s)) => json_string(s),
        (Format::Toml, Scalar::Str(s)) => match old_style {
            Style::Single => single_quoted(s, false).unwrap_or_else(|| json_string(s)),
            _ => json_string(s),
        },
        (Format::Python, Scalar::Str(s)) => match old_style {
            Style::Double => python_string(s, '"'),
            _ => python_string(s, '\''),
        },
        (Format::Yaml, Scalar::Str(s)) => match old_style {
            Style::Single => single_quoted(s, true).unwrap_or_else(|| json_string(s)),
            Style::Double => json_string(s),
            Style::Plain if plain_safe(s, in_flow) => s.clone(),
            Style::Plain => single_quoted(s, true).unwrap_or_else(|| json_string(s)),
        },
    })
}

/// A YAML boolean in the capitalisation of the old boolean (`True` stays
/// capitalised, as some YAML configs write it), else lower case.
fn yaml_bool(b: bool, old: Option<&ScalarNode>) -> String {
    let word = if b { "true" } else { "false" };
    let Some(old) = old.filter(|o| matches!(o.value, Scalar::Bool(_))) else {
        return word.to_string();
    };
    let raw = old.raw.as_str();
    if raw.chars().all(|c| c.is_ascii_uppercase()) {
        word.to_ascii_uppercase()
    } else if raw.chars().next().is_some_and(|c| c.is_ascii_uppercase()) {
        let mut c = word.chars();
        let first = c.next().map(|f| f.to_ascii_uppercase()).unwrap_or('T');
        std::iter::once(first).chain(c).collect()
    } else {
        word.to_string()
    }
}

/// A key as text: bare where the format allows it, else quoted.
pub(crate) fn key(format: Format, k: &str, quote: Option<char>) -> String {
    match format {
        Format::Json => json_string(k),
        Format::Yaml => match quote {
            Some('"') => json_string(k),
            Some('\'') => single_quoted(k, true).unwrap_or_else(|| json_string(k)),
            _ if plain_safe(k, true) => k.to_string(),
            _ => json_string(k),
        },
        Format::Toml => {
            if !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                k.to_string()
            } else {
                json_string(k)
            }
        }
        Format::Python => python_string(k, quote.unwrap_or('"')),
    }
}
