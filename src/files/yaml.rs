//! YAML: `saphyr-parser` events (with positions) build the located tree; plain
//! scalars are resolved the way PyYAML does (see `plain`) (the consumers are Python), plus
//! YAML 1.2 dot-less floats (`1e-5`, which OmegaConf also reads as a float).

use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle, Span};

use super::plain::resolve;
use super::{
    CannotWrite, Doc, Entry, Format, Kind, Map, Node, ParseErr, Scalar, ScalarNode, Splice, Style,
    indent_at, json, line_end, newline_of, render,
};

enum Frame {
    Map {
        start: usize,
        map: Map,
        key: Option<(String, usize, Option<char>)>,
        max_end: usize,
        anchored: bool,
    },
    Seq {
        start: usize,
        flow: bool,
        max_end: usize,
        anchored: bool,
    },
}

impl Frame {
    fn anchored(&self) -> bool {
        match self {
            Frame::Map { anchored, .. } | Frame::Seq { anchored, .. } => *anchored,
        }
    }
}

pub(crate) fn parse(text: &str) -> Result<Node, ParseErr> {
    let mut tree = TreeBuilder::new(text);
    for item in Parser::new_from_str(text) {
        let (ev, span) = item.map_err(|e| ParseErr {
            line: e.marker().line(),
            col: e.marker().col() + 1,
            message: e.info().to_string(),
        })?;
        if let Some(node) = tree.event(ev, span)? {
            tree.attach(node);
        }
    }
    Ok(tree.root.unwrap_or(Node {
        start: 0,
        end: 0,
        kind: Kind::Map(Map::default()),
    }))
}

/// Builds the located tree from the parser's events: open collections wait
/// on a stack of frames, and each finished node is handed to its parent.
struct TreeBuilder<'t> {
    text: &'t str,
    /// Character index -> byte offset (the parser counts characters).
    byte_of: Vec<usize>,
    stack: Vec<Frame>,
    root: Option<Node>,
    /// Anchor id -> the scalar it names (None for a mapping or list).
    anchors: HashMap<usize, Option<Scalar>>,
    docs: usize,
}

impl<'t> TreeBuilder<'t> {
    fn new(text: &'t str) -> Self {
        let mut byte_of: Vec<usize> = text.char_indices().map(|(b, _)| b).collect();
        byte_of.push(text.len());
        TreeBuilder {
            text,
            byte_of,
            stack: Vec::new(),
            root: None,
            anchors: HashMap::new(),
            docs: 0,
        }
    }

    /// The byte offset of character index `ci`.
    fn at(&self, ci: usize) -> usize {
        self.byte_of[ci.min(self.byte_of.len() - 1)]
    }

    /// The node `ev` finishes, if any (a collection's start only opens a frame).
    fn event(&mut self, ev: Event<'_>, span: Span) -> Result<Option<Node>, ParseErr> {
        let start = self.at(span.start.index());
        let node = match ev {
            Event::DocumentStart(_) => {
                self.docs += 1;
                if self.docs > 1 {
                    return Err(ParseErr {
                        line: span.start.line(),
                        col: span.start.col() + 1,
                        message: "several YAML documents (---) in one file are not supported"
                            .into(),
                    });
                }
                return Ok(None);
            }
            Event::MappingStart(anchor, _) => {
                self.open_map(start, anchor);
                return Ok(None);
            }
            Event::SequenceStart(anchor, _) => {
                self.open_seq(start, anchor);
                return Ok(None);
            }
            Event::MappingEnd => self.close_map(span),
            Event::SequenceEnd => self.close_seq(span),
            Event::Scalar(value, style, anchor, tag) => {
                self.scalar(start, span, &value, style, anchor, tag.is_some())
            }
            Event::Alias(id) => self.alias(start, span, id),
            Event::StreamStart | Event::StreamEnd | Event::DocumentEnd | Event::Nothing => {
                return Ok(None);
            }
        };
        Ok(Some(node))
    }

    /// A mapping starts: push its frame (a flow mapping remembers its `{`).
    fn open_map(&mut self, start: usize, anchor: usize) {
        let flow = self.text[start..].starts_with('{');
        self.stack.push(Frame::Map {
            start,
            map: Map {
                open: flow.then_some(start),
                ..Map::default()
            },
            key: None,
            max_end: start,
            anchored: anchor > 0,
        });
        if anchor > 0 {
            self.anchors.insert(anchor, None);
        }
    }

    /// A list starts: push its frame.
    fn open_seq(&mut self, start: usize, anchor: usize) {
        let flow = self.text[start..].starts_with('[');
        self.stack.push(Frame::Seq {
            start,
            flow,
            max_end: start,
            anchored: anchor > 0,
        });
        if anchor > 0 {
            self.anchors.insert(anchor, None);
        }
    }

    /// A mapping ends: its node runs to the closing `}` (flow) or to the end
    /// of its last value (block).
    fn close_map(&mut self, span: Span) -> Node {
        let Some(Frame::Map {
            start,
            mut map,
            max_end,
            ..
        }) = self.stack.pop()
        else {
            unreachable!("parser emits balanced events")
        };
        let end = if map.open.is_some() {
            map.close = Some(start_of_close(
                self.text,
                start,
                self.at(span.start.index()),
                '}',
            ));
            map.close.map_or(max_end, |c| c + 1)
        } else {
            max_end
        };
        Node {
            start,
            end,
            kind: Kind::Map(map),
        }
    }

    /// A list ends: its node runs to the closing `]` (flow) or to the end of
    /// its last item (block).
    fn close_seq(&mut self, span: Span) -> Node {
        let Some(Frame::Seq {
            start,
            flow,
            max_end,
            ..
        }) = self.stack.pop()
        else {
            unreachable!("parser emits balanced events")
        };
        let end = if flow {
            start_of_close(self.text, start, self.at(span.start.index()), ']') + 1
        } else {
            max_end
        };
        Node {
            start,
            end,
            kind: Kind::Seq,
        }
    }

    /// A scalar's node: its value (plain ones resolved as PyYAML does), where
    /// its text ends, and why it must be edited by hand, if it must.
    fn scalar(
        &mut self,
        start: usize,
        span: Span,
        value: &str,
        style: ScalarStyle,
        anchor: usize,
        tagged: bool,
    ) -> Node {
        let (sstyle, end, v) = match style {
            ScalarStyle::Plain => (Style::Plain, self.at(span.end.index()), resolve(value)),
            ScalarStyle::SingleQuoted => (
                Style::Single,
                quoted_end(self.text, start, '\''),
                Scalar::Str(value.to_string()),
            ),
            ScalarStyle::DoubleQuoted => (
                Style::Double,
                quoted_end(self.text, start, '"'),
                Scalar::Str(value.to_string()),
            ),
            _ => (
                Style::Plain,
                self.at(span.end.index()).max(start),
                Scalar::Str(value.to_string()),
            ),
        };
        let in_anchor = self.stack.iter().any(Frame::anchored);
        let locked = scalar_lock(style, anchor, tagged, in_anchor);
        if anchor > 0 {
            self.anchors.insert(anchor, Some(v.clone()));
        }
        Node {
            start,
            end,
            kind: Kind::Scalar(ScalarNode {
                value: v,
                style: sstyle,
                locked,
                raw: value.to_string(),
            }),
        }
    }

    /// An alias: a locked copy of the anchored scalar, or opaque when it
    /// names a mapping or list.
    fn alias(&self, start: usize, span: Span, id: usize) -> Node {
        let end = self.at(span.end.index()).max(start);
        match self.anchors.get(&id) {
            Some(Some(v)) => Node {
                start,
                end,
                kind: Kind::Scalar(ScalarNode {
                    value: v.clone(),
                    style: Style::Plain,
                    locked: Some(
                        "the value is an alias (*name) of another value; edit the anchored value"
                            .into(),
                    ),
                    raw: String::new(),
                }),
            },
            _ => Node {
                start,
                end,
                kind: Kind::Opaque("the value is an alias (*name) of a mapping or list".into()),
            },
        }
    }

    /// Hand the finished node to its parent.
    fn attach(&mut self, node: Node) {
        match self.stack.last_mut() {
            None => self.root = Some(node),
            Some(Frame::Seq { max_end, .. }) => *max_end = (*max_end).max(node.end),
            Some(Frame::Map {
                map, key, max_end, ..
            }) => {
                *max_end = (*max_end).max(node.end);
                match key.take() {
                    None => {
                        let (k, q) = key_text(&node);
                        *key = Some((k, node.start, q));
                    }
                    Some((k, key_start, key_quote)) => map.entries.push(Entry {
                        key: k,
                        key_start,
                        key_quote,
                        value: node,
                    }),
                }
            }
        }
    }
}

/// Why a scalar must not be edited in place, or None.
fn scalar_lock(style: ScalarStyle, anchor: usize, tagged: bool, in_anchor: bool) -> Option<String> {
    if matches!(style, ScalarStyle::Literal | ScalarStyle::Folded) {
        Some("the value is a block scalar (| or >); edit it by hand".to_string())
    } else if anchor > 0 {
        Some(
            "the value carries an anchor (&) that other keys may alias; edit it by hand"
                .to_string(),
        )
    } else if tagged {
        Some("the value carries a tag (!!type); edit it by hand".to_string())
    } else if in_anchor {
        Some(
            "the value is inside an anchored (&) block that other keys may alias; edit it by hand"
                .to_string(),
        )
    } else {
        None
    }
}

/// A mapping key node's text and its quote character.
fn key_text(node: &Node) -> (String, Option<char>) {
    match &node.kind {
        Kind::Scalar(s) => (
            s.raw.clone(),
            match s.style {
                Style::Single => Some('\''),
                Style::Double => Some('"'),
                Style::Plain => None,
            },
        ),
        _ => ("<complex key>".to_string(), None),
    }
}

/// The offset of the closing bracket of a flow collection: the parser's end
/// marker may sit on it or just after it.
fn start_of_close(text: &str, open: usize, hint: usize, close: char) -> usize {
    let hint = hint.min(text.len());
    if text[hint..].starts_with(close) {
        return hint;
    }
    text[open..hint].rfind(close).map_or(hint, |i| open + i)
}

/// The end (past the closing quote) of a quoted scalar starting at or after `start`.
fn quoted_end(text: &str, start: usize, q: char) -> usize {
    let Some(open) = text[start..].find(q).map(|i| start + i) else {
        return start;
    };
    let b = text.as_bytes();
    let mut i = open + 1;
    while i < b.len() {
        match (q, b[i]) {
            ('"', b'\\') => i += 2,
            ('"', b'"') => return i + 1,
            ('\'', b'\'') if b.get(i + 1) == Some(&b'\'') => i += 2,
            ('\'', b'\'') => return i + 1,
            _ => i += 1,
        }
    }
    text.len()
}

/// One indentation level of the file: the smallest positive difference between
/// a block mapping key and the keys of its block-mapping value; 2 if none.
fn step_of(text: &str, node: &Node) -> Option<usize> {
    let Kind::Map(m) = &node.kind else {
        return None;
    };
    if m.open.is_some() {
        return None;
    }
    let mut best: Option<usize> = None;
    for e in &m.entries {
        if let Kind::Map(child) = &e.value.kind
            && child.open.is_none()
            && let Some(c) = child.entries.first()
        {
            let (pi, _) = indent_at(text, e.key_start);
            let (ci, alone) = indent_at(text, c.key_start);
            if alone && ci.len() > pi.len() {
                let d = ci.len() - pi.len();
                best = Some(best.map_or(d, |b| b.min(d)));
            }
        }
        if let Some(d) = step_of(text, &e.value) {
            best = Some(best.map_or(d, |b| b.min(d)));
        }
    }
    best
}

fn block_lines(
    rest: &[&str],
    value: &Scalar,
    indent: &str,
    step: &str,
    nl: &str,
) -> Result<String, CannotWrite> {
    let k = render::key(Format::Yaml, rest[0], None);
    if rest.len() == 1 {
        let lit = render::literal(Format::Yaml, value, None, false)?;
        return Ok(format!("{indent}{k}: {lit}{nl}"));
    }
    let inner = format!("{indent}{step}");
    Ok(format!(
        "{indent}{k}:{nl}{}",
        block_lines(&rest[1..], value, &inner, step, nl)?
    ))
}

/// Insert the missing `rest` of a key path into the mapping `parent`.
pub(crate) fn insert(
    doc: &Doc,
    parent: &Node,
    _chain: &[&Entry],
    rest: &[&str],
    value: &Scalar,
) -> Result<Vec<Splice>, CannotWrite> {
    let text = doc.text();
    let Some(map) = parent.map() else {
        return Err(CannotWrite::ParentNotMapping);
    };
    if map.open.is_some() {
        return json::insert_braced(doc, Format::Yaml, parent, rest, value);
    }
    let nl = newline_of(text);
    let step = " ".repeat(step_of(text, &doc.root).unwrap_or(2));
    let Some(last) = map.entries.last() else {
        // An empty document: append at the end.
        let lead = if text.is_empty() || text.ends_with('\n') {
            ""
        } else {
            nl
        };
        return Ok(vec![Splice {
            start: text.len(),
            end: text.len(),
            with: format!("{lead}{}", block_lines(rest, value, "", &step, nl)?),
        }]);
    };
    let (indent, alone) = indent_at(text, last.key_start);
    if !alone {
        return Err(CannotWrite::MappingInList);
    }
    // After the last line holding content of the last entry.
    let mut p = last.value.end.max(last.key_start + 1).min(text.len());
    while p > last.key_start + 1 && text[..p].ends_with(|c: char| c.is_whitespace()) {
        p -= 1;
    }
    let mut at = line_end(text, p - 1);
    if at == text.len() && !text.ends_with('\n') {
        // No newline at the end of the file: appending would change the last
        // line, so the new key goes just before the last one instead.
        at = super::line_start(text, last.key_start);
    }
    Ok(vec![Splice {
        start: at,
        end: at,
        with: block_lines(rest, value, &indent, &step, nl)?,
    }])
}

/// `entry` is `key:` with an empty value: add `rest` below it, one level deeper.
pub(crate) fn insert_under_empty(
    doc: &Doc,
    entry: &Entry,
    rest: &[&str],
    value: &Scalar,
) -> Result<Vec<Splice>, CannotWrite> {
    let text = doc.text();
    let (indent, alone) = indent_at(text, entry.key_start);
    if !alone {
        return Err(CannotWrite::KeySharesLine);
    }
    let nl = newline_of(text);
    let step = " ".repeat(step_of(text, &doc.root).unwrap_or(2));
    let at = line_end(text, entry.key_start);
    let lead = if at == text.len() && !text.ends_with('\n') {
        nl
    } else {
        ""
    };
    Ok(vec![Splice {
        start: at,
        end: at,
        with: format!(
            "{lead}{}",
            block_lines(rest, value, &format!("{indent}{step}"), &step, nl)?
        ),
    }])
}
