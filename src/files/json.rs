//! JSON: a small lenient parser that records byte spans (accepts `//` and
//! `/* */` comments and trailing commas), and insertion into `{...}` objects,
//! shared with YAML flow mappings.

use super::{
    CannotWrite, Doc, Entry, Format, Kind, Map, Node, ParseErr, Scalar, ScalarNode, Splice, Style,
    indent_at, line_col, line_end, line_start, newline_of, render,
};

pub(crate) fn parse(text: &str) -> Result<Node, ParseErr> {
    let mut p = Parser {
        text,
        b: text.as_bytes(),
        i: 0,
    };
    if text.starts_with('\u{feff}') {
        p.i = 3;
    }
    p.ws()?;
    let root = p.value(0)?;
    p.ws()?;
    if p.i < p.b.len() {
        return Err(p.err("expected the end of the file after the top-level value"));
    }
    Ok(root)
}

struct Parser<'a> {
    text: &'a str,
    b: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn err_at(&self, at: usize, msg: impl Into<String>) -> ParseErr {
        let (line, col) = line_col(self.text, at);
        ParseErr {
            line,
            col,
            message: msg.into(),
        }
    }

    fn err(&self, msg: impl Into<String>) -> ParseErr {
        let found = match self.text[self.i.min(self.text.len())..].chars().next() {
            Some(c) => format!(" (found {c:?})"),
            None => " (found the end of the file)".to_string(),
        };
        self.err_at(self.i, format!("{}{found}", msg.into()))
    }

    /// Skip whitespace and comments.
    fn ws(&mut self) -> Result<(), ParseErr> {
        loop {
            while self.i < self.b.len() && self.b[self.i].is_ascii_whitespace() {
                self.i += 1;
            }
            if self.b[self.i..].starts_with(b"//") {
                while self.i < self.b.len() && self.b[self.i] != b'\n' {
                    self.i += 1;
                }
            } else if self.b[self.i..].starts_with(b"/*") {
                let start = self.i;
                match self.text[self.i + 2..].find("*/") {
                    Some(k) => self.i += 2 + k + 2,
                    None => return Err(self.err_at(start, "unterminated /* comment")),
                }
            } else {
                return Ok(());
            }
        }
    }

    fn value(&mut self, depth: usize) -> Result<Node, ParseErr> {
        if depth > 256 {
            return Err(self.err("nesting too deep"));
        }
        let start = self.i;
        let Some(&c) = self.b.get(self.i) else {
            return Err(self.err("expected a value"));
        };
        match c {
            b'{' => self.object(depth),
            b'[' => {
                self.i += 1;
                self.ws()?;
                if self.b.get(self.i) == Some(&b']') {
                    self.i += 1;
                    return Ok(Node {
                        start,
                        end: self.i,
                        kind: Kind::Seq,
                    });
                }
                loop {
                    self.ws()?;
                    if self.b.get(self.i) == Some(&b']') {
                        // trailing comma
                        self.i += 1;
                        break;
                    }
                    self.value(depth + 1)?;
                    self.ws()?;
                    match self.b.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            break;
                        }
                        _ => return Err(self.err("expected `,` or `]` in a list")),
                    }
                }
                Ok(Node {
                    start,
                    end: self.i,
                    kind: Kind::Seq,
                })
            }
            b'"' => {
                let s = self.string()?;
                Ok(scalar(start, self.i, Scalar::Str(s), Style::Double))
            }
            b't' | b'f' | b'n' => {
                for (word, v) in [
                    ("true", Scalar::Bool(true)),
                    ("false", Scalar::Bool(false)),
                    ("null", Scalar::Null),
                ] {
                    if self.text[self.i..].starts_with(word) {
                        self.i += word.len();
                        return Ok(scalar(start, self.i, v, Style::Plain));
                    }
                }
                Err(self.err("expected a value (true, false, null, a number, a string, { or [)"))
            }
            b'-' | b'0'..=b'9' => {
                while self.i < self.b.len()
                    && matches!(
                        self.b[self.i],
                        b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'
                    )
                {
                    self.i += 1;
                }
                let raw = &self.text[start..self.i];
                let v =
                    number(raw).ok_or_else(|| self.err_at(start, format!("bad number {raw:?}")))?;
                Ok(scalar(start, self.i, v, Style::Plain))
            }
            _ => Err(self.err("expected a value (true, false, null, a number, a string, { or [)")),
        }
    }

    fn object(&mut self, depth: usize) -> Result<Node, ParseErr> {
        let start = self.i;
        self.i += 1;
        let mut map = Map {
            open: Some(start),
            ..Map::default()
        };
        loop {
            self.ws()?;
            match self.b.get(self.i) {
                Some(b'}') => {
                    map.close = Some(self.i);
                    self.i += 1;
                    break;
                }
                Some(b'"') => {}
                _ => return Err(self.err("expected a \"key\" or `}` in an object")),
            }
            let key_start = self.i;
            let key = self.string()?;
            self.ws()?;
            if self.b.get(self.i) != Some(&b':') {
                return Err(self.err(format!("expected `:` after the key {key:?}")));
            }
            self.i += 1;
            self.ws()?;
            let value = self.value(depth + 1)?;
            map.entries.push(Entry {
                key,
                key_start,
                key_quote: Some('"'),
                value,
            });
            self.ws()?;
            match self.b.get(self.i) {
                Some(b',') => self.i += 1,
                Some(b'}') => {}
                _ => return Err(self.err("expected `,` or `}` after an object member")),
            }
        }
        Ok(Node {
            start,
            end: self.i,
            kind: Kind::Map(map),
        })
    }

    fn string(&mut self) -> Result<String, ParseErr> {
        let start = self.i;
        self.i += 1;
        let mut out = String::new();
        loop {
            let Some(c) = self.text[self.i..].chars().next() else {
                return Err(self.err_at(start, "unterminated string"));
            };
            self.i += c.len_utf8();
            match c {
                '"' => return Ok(out),
                '\n' => return Err(self.err_at(start, "unterminated string (newline inside)")),
                '\\' => {
                    let Some(e) = self.text[self.i..].chars().next() else {
                        return Err(self.err_at(start, "unterminated string"));
                    };
                    self.i += 1;
                    match e {
                        '"' => out.push('"'),
                        '\\' => out.push('\\'),
                        '/' => out.push('/'),
                        'b' => out.push('\u{8}'),
                        'f' => out.push('\u{c}'),
                        'n' => out.push('\n'),
                        'r' => out.push('\r'),
                        't' => out.push('\t'),
                        'u' => {
                            let hex = |p: &Self, at: usize| {
                                p.text
                                    .get(at..at + 4)
                                    .and_then(|h| u32::from_str_radix(h, 16).ok())
                            };
                            let Some(mut cp) = hex(self, self.i) else {
                                return Err(self.err_at(self.i, "bad \\u escape"));
                            };
                            self.i += 4;
                            if (0xD800..0xDC00).contains(&cp)
                                && self.text[self.i..].starts_with("\\u")
                                && let Some(lo) = hex(self, self.i + 2)
                            {
                                cp = 0x10000
                                    + ((cp - 0xD800) << 10)
                                    + (lo.wrapping_sub(0xDC00) & 0x3FF);
                                self.i += 6;
                            }
                            out.push(char::from_u32(cp).unwrap_or('\u{fffd}'));
                        }
                        other => {
                            return Err(self.err_at(self.i - 1, format!("bad escape \\{other}")));
                        }
                    }
                }
                c => out.push(c),
            }
        }
    }
}

fn scalar(start: usize, end: usize, value: Scalar, style: Style) -> Node {
    Node {
        start,
        end,
        kind: Kind::Scalar(ScalarNode {
            value,
            style,
            locked: None,
            raw: String::new(),
        }),
    }
}

fn number(raw: &str) -> Option<Scalar> {
    if !raw.contains(['.', 'e', 'E'])
        && let Ok(i) = raw.parse::<i64>()
    {
        return Some(Scalar::Int(i));
    }
    let digits = raw.strip_prefix('-').unwrap_or(raw);
    if !digits.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    raw.parse::<f64>().ok().map(Scalar::Float)
}

/// Offset of the first significant character at or after `from`, skipping
/// whitespace and comments of `format` (`//`, `/* */` for JSON; `#` for YAML).
fn next_significant(text: &str, mut i: usize, format: Format) -> usize {
    let b = text.as_bytes();
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        let rest = &b[i..];
        if format == Format::Json && rest.starts_with(b"//")
            || format != Format::Json && rest.starts_with(b"#")
        {
            i = line_end(text, i);
        } else if format == Format::Json && rest.starts_with(b"/*") {
            i = text[i..].find("*/").map_or(b.len(), |k| i + k + 2);
        } else {
            return i;
        }
    }
}

/// The text of a new member `key: value`, nesting the remaining path segments
/// as new objects. `indent` is the member's indentation, `step` one level.
fn member(
    format: Format,
    rest: &[&str],
    value: &Scalar,
    quote: Option<char>,
    lay: &Layout,
) -> Result<String, CannotWrite> {
    let k = render::key(format, rest[0], quote);
    if rest.len() == 1 {
        // In a YAML flow mapping with "quoted" keys, strings are quoted too.
        let lit = match value {
            Scalar::Str(s) if format == Format::Yaml && quote == Some('"') => {
                render::json_string(s)
            }
            _ => render::literal(format, value, None, format == Format::Yaml)?,
        };
        return Ok(format!("{k}: {lit}"));
    }
    match lay {
        Layout::Inline => Ok(format!(
            "{k}: {{{}}}",
            member(format, &rest[1..], value, quote, lay)?
        )),
        Layout::Lines { indent, step, nl } => {
            let inner_indent = format!("{indent}{step}");
            let inner = member(
                format,
                &rest[1..],
                value,
                quote,
                &Layout::Lines {
                    indent: inner_indent.clone(),
                    step: step.clone(),
                    nl,
                },
            )?;
            Ok(format!("{k}: {{{nl}{inner_indent}{inner}{nl}{indent}}}"))
        }
    }
}

enum Layout {
    Inline,
    Lines {
        indent: String,
        step: String,
        nl: &'static str,
    },
}

/// Insert `rest` (the missing part of the key path) into the braced mapping
/// `parent`. Only whole new lines are added when the mapping is laid out one
/// member per line: the new member goes after the last member when the mapping
/// uses trailing commas, else just before the last member (so no existing line
/// needs a comma added).
pub(crate) fn insert_braced(
    doc: &Doc,
    format: Format,
    parent: &Node,
    rest: &[&str],
    value: &Scalar,
) -> Result<Vec<Splice>, CannotWrite> {
    let text = doc.text();
    let Some(map) = parent.map() else {
        return Err(CannotWrite::ParentNotMapping);
    };
    let (Some(open), Some(close)) = (map.open, map.close) else {
        return Err(CannotWrite::NoBraces);
    };
    let nl = newline_of(text);
    let Some(last) = map.entries.last() else {
        let m = member(format, rest, value, Some('"'), &Layout::Inline)?;
        return Ok(vec![Splice {
            start: open + 1,
            end: close,
            with: m,
        }]);
    };
    let quote = last.key_quote.or(if format == Format::Json {
        Some('"')
    } else {
        None
    });
    let (indent, alone) = indent_at(text, last.key_start);
    let after = next_significant(text, last.value.end, format);
    let trailing_comma = text.as_bytes().get(after) == Some(&b',');
    if !alone {
        let m = member(format, rest, value, quote, &Layout::Inline)?;
        return Ok(vec![Splice {
            start: last.value.end,
            end: last.value.end,
            with: format!(", {m}"),
        }]);
    }
    let (open_indent, _) = indent_at(text, open);
    let step = if indent.len() > open_indent.len() && indent.starts_with(&open_indent) {
        indent[open_indent.len()..].to_string()
    } else {
        "  ".to_string()
    };
    let lay = Layout::Lines {
        indent: indent.clone(),
        step,
        nl,
    };
    let m = member(format, rest, value, quote, &lay)?;
    if trailing_comma {
        let at = line_end(text, after);
        let lead = if at == text.len() && !text.ends_with('\n') {
            nl
        } else {
            ""
        };
        Ok(vec![Splice {
            start: at,
            end: at,
            with: format!("{lead}{indent}{m},{nl}"),
        }])
    } else {
        let at = line_start(text, last.key_start);
        Ok(vec![Splice {
            start: at,
            end: at,
            with: format!("{indent}{m},{nl}"),
        }])
    }
}

pub(crate) fn insert(
    doc: &Doc,
    parent: &Node,
    rest: &[&str],
    value: &Scalar,
) -> Result<Vec<Splice>, CannotWrite> {
    insert_braced(doc, Format::Json, parent, rest, value)
}
