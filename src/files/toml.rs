//! TOML: `toml_edit::Document` (the immutable, span-keeping one) locates
//! values; insertion adds a `key = value` line to the table's body, or a new
//! `[table]` at the end of the file.

use toml_edit::{Document, Item, Table, Value};

use super::{
    CannotWrite, Entry, Format, Kind, Map, Node, ParseErr, Scalar, ScalarNode, Splice, Style,
    line_col, line_end, line_start, newline_of, render,
};

fn doc(text: &str) -> Result<Document<&str>, ParseErr> {
    Document::parse(text).map_err(|e| {
        let at = e.span().map_or(0, |s| s.start);
        let (line, col) = line_col(text, at);
        ParseErr {
            line,
            col,
            message: e.message().trim().to_string(),
        }
    })
}

pub(crate) fn parse(text: &str) -> Result<Node, ParseErr> {
    let d = doc(text)?;
    Ok(table_node(text, d.as_table()))
}

fn table_node(text: &str, t: &Table) -> Node {
    let mut map = Map::default();
    for (k, item) in t.iter() {
        let key_start = t.key(k).and_then(|key| key.span()).map_or(0, |s| s.start);
        let value = match item {
            Item::Value(v) => value_node(text, v),
            Item::Table(sub) => table_node(text, sub),
            Item::ArrayOfTables(a) => {
                let span = a.span().unwrap_or(0..0);
                Node {
                    start: span.start,
                    end: span.end,
                    kind: Kind::Seq,
                }
            }
            Item::None => continue,
        };
        let key_quote = text[key_start..]
            .chars()
            .next()
            .filter(|c| *c == '"' || *c == '\'');
        map.entries.push(Entry {
            key: k.to_string(),
            key_start,
            key_quote,
            value,
        });
    }
    let span = t.span().unwrap_or(0..0);
    Node {
        start: span.start,
        end: span.end,
        kind: Kind::Map(map),
    }
}

fn value_node(text: &str, v: &Value) -> Node {
    let span = v.span().unwrap_or(0..0);
    let raw = &text[span.clone()];
    let (value, style, locked) = match v {
        Value::String(s) => {
            let style = if raw.starts_with('\'') {
                Style::Single
            } else {
                Style::Double
            };
            let locked = (raw.starts_with("\"\"\"") || raw.starts_with("'''"))
                .then(|| "the value is a multi-line string; edit it by hand".to_string());
            (Scalar::Str(s.value().clone()), style, locked)
        }
        Value::Integer(i) => (Scalar::Int(*i.value()), Style::Plain, None),
        Value::Float(x) => (Scalar::Float(*x.value()), Style::Plain, None),
        Value::Boolean(b) => (Scalar::Bool(*b.value()), Style::Plain, None),
        Value::Datetime(d) => (
            Scalar::Str(d.value().to_string()),
            Style::Plain,
            Some("the value is a date/time; edit it by hand".to_string()),
        ),
        Value::Array(_) => {
            return Node {
                start: span.start,
                end: span.end,
                kind: Kind::Seq,
            };
        }
        Value::InlineTable(t) => {
            let mut map = Map::default();
            for (k, v) in t.iter() {
                let key_start = t.key(k).and_then(|key| key.span()).map_or(0, |s| s.start);
                map.entries.push(Entry {
                    key: k.to_string(),
                    key_start,
                    key_quote: None,
                    value: value_node(text, v),
                });
            }
            map.open = Some(span.start);
            map.close = Some(span.end.saturating_sub(1));
            return Node {
                start: span.start,
                end: span.end,
                kind: Kind::Map(map),
            };
        }
    };
    Node {
        start: span.start,
        end: span.end,
        kind: Kind::Scalar(ScalarNode {
            value,
            style,
            locked,
            raw: raw.to_string(),
        }),
    }
}

/// Insert `rest` under the table at `parent_path` (which exists up to
/// `parent_path.len()` segments; `rest[0]` is missing there).
pub(crate) fn insert(
    text: &str,
    parent_path: &[&str],
    rest: &[&str],
    value: &Scalar,
) -> Result<Vec<Splice>, CannotWrite> {
    let d = doc(text).map_err(|e| CannotWrite::TomlParse(e.message))?;
    let nl = newline_of(text);
    let lit = render::literal(Format::Toml, value, None, false)?;
    let leaf = render::key(Format::Toml, rest[rest.len() - 1], None);
    let mut t = d.as_table();
    for seg in parent_path {
        match t.get(seg) {
            Some(Item::Table(sub)) => t = sub,
            Some(Item::Value(Value::InlineTable(_))) => {
                return Err(CannotWrite::InlineTable(seg.to_string()));
            }
            _ => return Err(CannotWrite::NotTable(seg.to_string())),
        }
    }
    if t.is_dotted() {
        return Err(CannotWrite::DottedTable);
    }
    let full: Vec<String> = parent_path
        .iter()
        .chain(&rest[..rest.len() - 1])
        .map(|s| render::key(Format::Toml, s, None))
        .collect();
    // A new table for the missing parents (or for an implicit parent): append.
    if rest.len() > 1 || (!parent_path.is_empty() && t.is_implicit()) {
        let lead = if text.is_empty() || text.ends_with('\n') {
            ""
        } else {
            nl
        };
        return Ok(vec![Splice {
            start: text.len(),
            end: text.len(),
            with: format!("{lead}{nl}[{}]{nl}{leaf} = {lit}{nl}", full.join(".")),
        }]);
    }
    let line = format!("{leaf} = {lit}{nl}");
    // After the last `key = value` of this table's own body.
    let last_kv = t
        .iter()
        .filter_map(|(_, item)| match item {
            Item::Value(v) => v.span(),
            _ => None,
        })
        .map(|s| s.end)
        .max();
    let at = if let Some(end) = last_kv {
        line_end(text, end.saturating_sub(1))
    } else if parent_path.is_empty() {
        // No top-level keys: before the first table header.
        let first = t
            .iter()
            .filter_map(|(_, item)| match item {
                Item::Table(s) => s.span().map(|r| r.start),
                Item::ArrayOfTables(a) => a.span().map(|r| r.start),
                _ => None,
            })
            .min()
            .unwrap_or(text.len());
        line_start(text, first)
    } else {
        // An empty table: after its header line.
        match t.span() {
            Some(s) => line_end(text, s.start),
            None => return Err(CannotWrite::NoTableHeader),
        }
    };
    let lead = if at == text.len() && !text.is_empty() && !text.ends_with('\n') {
        nl
    } else {
        ""
    };
    Ok(vec![Splice {
        start: at,
        end: at,
        with: format!("{lead}{line}"),
    }])
}
