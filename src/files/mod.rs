//! Format-preserving edits of the config files a training command names.
//!
//! oomguard never modifies the user's files: a knob that lives in a file is
//! changed in a copy, and the copy must differ from the original only where a
//! value changed. So every edit here is a splice of the original text: the
//! parser of each format is used to *locate* the value (byte span) and to
//! validate, never to re-serialize the document. Comments, key order, quoting,
//! indentation and blank lines are untouched.
//!
//! Formats (by extension, see [`format_of`]; `Doc::load` falls back to sniffing a
//! leading `{` as JSON, e.g. open-instruct's `*.conf` DeepSpeed files):
//! - JSON: own lenient parser (accepts `//` and `/* */` comments and trailing
//!   commas, which DeepSpeed itself would reject; none of the corpus has them).
//! - YAML: `saphyr-parser` events give positions; block and flow mappings are
//!   read; values in both are written; inserting a key works in block mappings
//!   and in multi-line flow mappings (GPT-NeoX's `{ "a": 1, # c }` style).
//!   Plain scalars resolve like PyYAML (YAML 1.1 booleans `yes/no/on/off`),
//!   plus YAML 1.2 floats without a dot (`1e-5`).
//! - TOML: `toml_edit` (immutable `Document`, which keeps spans).
//! - Python: a small tokenizer; top-level `NAME = literal` assignments and
//!   `"key": literal` entries of dict literals anywhere in the file.
//!
//! The modules depend one way: each format's module (`json`, `yaml`, `toml`, `python`)
//! writes values with `render`; `render` and `yaml` read YAML plain scalars with
//! `plain` (a leaf); `yaml` inserts into flow mappings with `json`'s braced insertion.
//!
//! Key paths are dotted (`zero_optimization.offload_optimizer.device`); a key
//! that itself contains a dot cannot be addressed (rare in these configs).
//!
//! Limitations (each gives a clear `Unsupported` error rather than a bad edit):
//! - sequences cannot be indexed; list values are `NotScalar`;
//! - YAML: anchored (`&a`), aliased (`*a`), tagged and block (`|`, `>`) values
//!   are read but not written; merge keys (`<<:`) are not followed; one
//!   document per file; a key under `- item:` in a list cannot be added;
//! - JSON / YAML flow: a new member is inserted just before the last member
//!   (after it when the object uses trailing commas), so no existing line
//!   changes; single-line objects get the member inline;
//! - TOML: no null; keys cannot be added to inline tables or dotted-key tables;
//!   a missing table is appended as a new `[a.b]` section at the end;
//! - Python: only literals; a missing top-level name is appended at the end;
//!   missing dict-literal keys are not added;
//! - a file without a final newline: appending at its end changes its last
//!   line in the diff (YAML avoids this by inserting before the last key).
//!
//! Every `set` re-parses the edited text and reads the value back before it is
//! accepted; setting a key back to its original value restores the original
//! spelling (`6e-4`, `~`, quotes) byte for byte.

mod json;
mod plain;
mod python;
mod render;
mod toml;
mod yaml;

#[cfg(test)]
mod tests;

use std::fmt;
use std::path::{Path, PathBuf};

/// The syntax of a config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
    Toml,
    Python,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Json => "JSON",
            Format::Yaml => "YAML",
            Format::Toml => "TOML",
            Format::Python => "Python",
        })
    }
}

/// The format of a file by its extension: `.json`, `.yaml`/`.yml`, `.toml`, `.py`.
pub fn format_of(path: &Path) -> Option<Format> {
    let ext = path.extension()?.to_str()?.to_ascii_lowercase();
    match ext.as_str() {
        "json" => Some(Format::Json),
        "yaml" | "yml" => Some(Format::Yaml),
        "toml" => Some(Format::Toml),
        "py" => Some(Format::Python),
        _ => None,
    }
}

/// A format guessed from the content, for files whose extension says nothing
/// (`stage3_offloading_accelerate.conf` is DeepSpeed JSON): a first significant
/// character `{` or `[` means JSON.
fn sniff(text: &str) -> Option<Format> {
    let first = text
        .trim_start_matches('\u{feff}')
        .trim_start()
        .chars()
        .next()?;
    matches!(first, '{' | '[').then_some(Format::Json)
}

/// One value read from or written to a config file.
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar {
    Int(i64),
    Float(f64),
    Bool(bool),
    /// A string; DeepSpeed's `"auto"` is `Str("auto")`.
    Str(String),
    Null,
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Int(i) => write!(f, "{i}"),
            Scalar::Float(x) => write!(f, "{x:?}"),
            Scalar::Bool(b) => write!(f, "{b}"),
            Scalar::Str(s) => write!(f, "{s:?}"),
            Scalar::Null => f.write_str("null"),
        }
    }
}

/// What can go wrong reading or editing a config file. Every message names the
/// file and says what was expected.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}:{line}: {message}", path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{} has no key {key}{}", path.display(), siblings_note(key, available))]
    NoKey {
        path: PathBuf,
        key: String,
        /// The keys that do exist in the deepest mapping on the key's path.
        available: Vec<String>,
    },
    #[error("{}: {key} holds a table or list, not a single value", path.display())]
    NotScalar { path: PathBuf, key: String },
    #[error("{}: cannot handle {key}: {why}", path.display())]
    Unsupported {
        path: PathBuf,
        key: String,
        why: String,
    },
}

/// Why a value cannot be written where a key asks for it: the reason of a
/// [`FileError::Unsupported`] that the writers and inserters find.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CannotWrite {
    #[error("only finite numbers can be written")]
    NotFinite,
    #[error("TOML has no null value; remove the key by hand instead")]
    TomlNull,
    #[error("the parent is not a mapping")]
    ParentNotMapping,
    #[error("the parent mapping has no braces")]
    NoBraces,
    #[error(
        "the mapping starts on a line shared with other syntax (`- key:` in a list); add the key by hand"
    )]
    MappingInList,
    #[error("the key shares its line with other syntax; add the value by hand")]
    KeySharesLine,
    /// The TOML file no longer parses (its parser's message).
    #[error("{0}")]
    TomlParse(String),
    #[error("{0} is an inline table {{...}}; add the key by hand")]
    InlineTable(String),
    #[error("{0} is not a table")]
    NotTable(String),
    #[error("the table is defined with dotted keys (a.b = ...); add the key by hand")]
    DottedTable,
    #[error("cannot locate the table's header")]
    NoTableHeader,
    #[error(
        "only a missing top-level `NAME = value` can be added to a Python config; add dict keys by hand"
    )]
    PythonNested,
    #[error("{0:?} is not a Python identifier")]
    NotIdentifier(String),
}

fn siblings_note(key: &str, available: &[String]) -> String {
    let parent = key.rsplit_once('.').map(|(p, _)| p);
    let at = match parent {
        Some(p) => format!("at {p}"),
        None => "at the top level".to_string(),
    };
    if available.is_empty() {
        format!("; there are no keys {at}")
    } else {
        format!("; the keys {at} are: {}", available.join(", "))
    }
}

// ---------------------------------------------------------------------------
// The located tree shared by all formats.

/// How a scalar was written in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Style {
    Plain,
    /// `'...'`
    Single,
    /// `"..."`
    Double,
}

#[derive(Debug, Clone)]
pub(crate) struct ScalarNode {
    pub value: Scalar,
    pub style: Style,
    /// Why this value may be read but not rewritten (anchor, block scalar, ...).
    pub locked: Option<String>,
    /// YAML booleans: the capitalisation used (`True`, `TRUE`, `true`).
    pub raw: String,
}

#[derive(Debug, Clone)]
pub(crate) enum Kind {
    Map(Map),
    Seq,
    Scalar(ScalarNode),
    /// Something that is not a literal (a Python expression, a YAML alias to a
    /// collection): reading and writing are refused with this reason.
    Opaque(String),
}

#[derive(Debug, Clone)]
pub(crate) struct Node {
    /// Byte span of the value text in the document.
    pub start: usize,
    pub end: usize,
    pub kind: Kind,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Map {
    pub entries: Vec<Entry>,
    /// Byte offsets of `{` and `}` when the mapping is written with braces
    /// (JSON objects, YAML flow mappings, Python dict literals).
    pub open: Option<usize>,
    pub close: Option<usize>,
}

#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub key: String,
    pub key_start: usize,
    /// The quote character around the key, if any.
    pub key_quote: Option<char>,
    pub value: Node,
}

impl Node {
    fn map(&self) -> Option<&Map> {
        match &self.kind {
            Kind::Map(m) => Some(m),
            _ => None,
        }
    }
}

/// A parse failure inside a format module; `line` is 1-based, `col` 1-based.
#[derive(Debug)]
pub(crate) struct ParseErr {
    pub line: usize,
    pub col: usize,
    pub message: String,
}

/// One text replacement: bytes `start..end` become `with`.
#[derive(Debug, Clone)]
pub(crate) struct Splice {
    pub start: usize,
    pub end: usize,
    pub with: String,
}

fn apply(text: &str, splices: &[Splice]) -> String {
    let mut sorted: Vec<&Splice> = splices.iter().collect();
    sorted.sort_by_key(|s| (s.start, s.end));
    let mut out = String::with_capacity(text.len() + 64);
    let mut at = 0;
    for s in sorted {
        out.push_str(&text[at..s.start]);
        out.push_str(&s.with);
        at = s.end;
    }
    out.push_str(&text[at..]);
    out
}

/// 1-based line and column of a byte offset.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// Byte offset of the start of the line holding `offset`.
pub(crate) fn line_start(text: &str, offset: usize) -> usize {
    text[..offset].rfind('\n').map_or(0, |i| i + 1)
}

/// Byte offset just past the end of the line holding `offset` (past its `\n`,
/// or the end of the text).
pub(crate) fn line_end(text: &str, offset: usize) -> usize {
    text[offset..]
        .find('\n')
        .map_or(text.len(), |i| offset + i + 1)
}

/// The indentation (leading spaces/tabs) of the line holding `offset`, and
/// whether only whitespace precedes `offset` on that line.
pub(crate) fn indent_at(text: &str, offset: usize) -> (String, bool) {
    let ls = line_start(text, offset);
    let prefix = &text[ls..offset];
    let indent: String = prefix
        .chars()
        .take_while(|c| *c == ' ' || *c == '\t')
        .collect();
    let alone = prefix.trim().is_empty();
    (indent, alone)
}

/// The line ending the file uses (`\r\n` when its first line ends so).
pub(crate) fn newline_of(text: &str) -> &'static str {
    match text.find('\n') {
        Some(i) if i > 0 && text.as_bytes()[i - 1] == b'\r' => "\r\n",
        _ => "\n",
    }
}

// ---------------------------------------------------------------------------
// Doc

/// One config file, parsed, with its original and current text.
#[derive(Debug, Clone)]
pub struct Doc {
    path: PathBuf,
    format: Format,
    original: String,
    text: String,
    root: Node,
    /// The tree of the original text (to restore original spellings).
    original_root: Node,
    /// Python only: dict literals that are not the value of a top-level
    /// assignment (e.g. inside a function), searched for bare keys.
    loose: Vec<Node>,
}

enum Found<'a> {
    /// The key exists; its value node.
    Value(&'a Node),
    /// `segs[..matched]` exist and lead to the mapping `parent`;
    /// `segs[matched]` is missing there. `chain` are the entries walked.
    Missing {
        matched: usize,
        parent: &'a Node,
        chain: Vec<&'a Entry>,
    },
    /// `segs[..=at]` holds a scalar (or list) where a mapping was needed.
    Blocked {
        at: usize,
        node: &'a Node,
        chain: Vec<&'a Entry>,
    },
}

fn lookup<'a>(root: &'a Node, segs: &[&str]) -> Found<'a> {
    let mut node = root;
    let mut chain = Vec::new();
    for (i, seg) in segs.iter().enumerate() {
        let Some(map) = node.map() else {
            return Found::Blocked {
                at: i.saturating_sub(1),
                node,
                chain,
            };
        };
        match map.entries.iter().rev().find(|e| e.key == *seg) {
            Some(e) => {
                chain.push(e);
                node = &e.value;
            }
            None => {
                return Found::Missing {
                    matched: i,
                    parent: node,
                    chain,
                };
            }
        }
    }
    Found::Value(node)
}

/// All mappings in a tree (for Python's bare dict-key search).
fn collect_maps<'a>(node: &'a Node, out: &mut Vec<&'a Node>) {
    if let Kind::Map(m) = &node.kind {
        out.push(node);
        for e in &m.entries {
            collect_maps(&e.value, out);
        }
    }
}

impl Doc {
    /// Read and parse a file.
    pub fn load(path: &Path) -> Result<Doc, FileError> {
        let text = crate::untrusted::read_config(path).map_err(|source| FileError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Doc::parse(path, text)
    }

    /// Parse `text` as the content of `path` (format from the extension, else
    /// sniffed). Syntax is validated here, up front.
    pub fn parse(path: &Path, text: String) -> Result<Doc, FileError> {
        let format =
            format_of(path)
                .or_else(|| sniff(&text))
                .ok_or_else(|| FileError::Unsupported {
                    path: path.to_path_buf(),
                    key: String::new(),
                    why: "unknown config format: expected a .json, .yaml, .yml, .toml or .py file \
                      (or JSON content starting with `{`)"
                        .to_string(),
                })?;
        Doc::parse_as(path, text, format)
    }

    /// Parse `text` in the given format, whatever the file name says.
    pub fn parse_as(path: &Path, text: String, format: Format) -> Result<Doc, FileError> {
        let (root, loose) = build(format, &text).map_err(|e| FileError::Parse {
            path: path.to_path_buf(),
            line: e.line,
            message: format!("column {}: invalid {format}: {}", e.col, e.message),
        })?;
        Ok(Doc {
            path: path.to_path_buf(),
            format,
            original: text.clone(),
            text,
            original_root: root.clone(),
            root,
            loose,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// The current text (the original with every `set` applied).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The text as loaded.
    pub fn original(&self) -> &str {
        &self.original
    }

    /// Whether the current text differs from the original.
    pub fn changed(&self) -> bool {
        self.text != self.original
    }

    fn unsupported(&self, key: &str, why: impl Into<String>) -> FileError {
        FileError::Unsupported {
            path: self.path.clone(),
            key: key.to_string(),
            why: why.into(),
        }
    }

    fn find<'a>(&'a self, key: &str) -> Result<Found<'a>, FileError> {
        let segs: Vec<&str> = key.split('.').collect();
        if key.is_empty() || segs.iter().any(|s| s.is_empty()) {
            return Err(self.unsupported(key, "empty key or empty segment in the dotted key path"));
        }
        let found = lookup(&self.root, &segs);
        if self.format != Format::Python || matches!(found, Found::Value(_)) {
            return Ok(found);
        }
        // Python: a key not assigned at module level may be a dict-literal key.
        let mut maps = Vec::new();
        for e in self.root.map().map(|m| m.entries.as_slice()).unwrap_or(&[]) {
            collect_maps(&e.value, &mut maps);
        }
        for n in &self.loose {
            collect_maps(n, &mut maps);
        }
        let hits: Vec<&Node> = maps
            .iter()
            .filter_map(|m| match lookup(m, &segs) {
                Found::Value(v) => Some(v),
                _ => None,
            })
            .collect();
        match hits.len() {
            0 => Ok(found),
            1 => Ok(Found::Value(hits[0])),
            n => Err(self.unsupported(
                key,
                format!("the key appears in {n} dict literals; name the dict (e.g. config.{key})"),
            )),
        }
    }

    /// The value at a dotted key path; `None` when the key (or a parent) is absent
    /// or a parent is null.
    pub fn get(&self, key: &str) -> Result<Option<Scalar>, FileError> {
        match self.find(key)? {
            Found::Value(node) => match &node.kind {
                Kind::Scalar(s) => Ok(Some(s.value.clone())),
                Kind::Map(_) | Kind::Seq => Err(FileError::NotScalar {
                    path: self.path.clone(),
                    key: key.to_string(),
                }),
                Kind::Opaque(why) => Err(self.unsupported(key, why.clone())),
            },
            Found::Missing { .. } => Ok(None),
            Found::Blocked { chain, .. } if chain.is_empty() => {
                Err(self.unsupported(key, "the file's top level is not a mapping"))
            }
            Found::Blocked { at, node, .. } => match &node.kind {
                Kind::Scalar(ScalarNode {
                    value: Scalar::Null,
                    ..
                }) => Ok(None),
                _ => Err(self.unsupported(
                    key,
                    format!(
                        "{} holds a value, not a mapping",
                        key.split('.').take(at + 1).collect::<Vec<_>>().join(".")
                    ),
                )),
            },
        }
    }

    /// [`Doc::get`], where a list of scalars is its flow text (`[0, 1]`, also for a
    /// block list `- 0` / `- 1`): for values that may be either (Lightning's
    /// `devices: [0, 1]`). `None` when absent or neither.
    pub fn scalar_or_list(&self, key: &str) -> Option<Scalar> {
        match self.find(key).ok()? {
            Found::Value(Node {
                start,
                end,
                kind: Kind::Seq,
            }) => {
                let text = self.text.get(*start..*end)?.trim();
                if text.starts_with('[') {
                    return Some(Scalar::Str(text.to_string()));
                }
                let items: Option<Vec<&str>> = text
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(|l| l.strip_prefix('-').map(str::trim))
                    .collect();
                Some(Scalar::Str(format!("[{}]", items?.join(", "))))
            }
            _ => self.get(key).ok().flatten(),
        }
    }

    /// Like [`Doc::get`], but an absent key is an error naming the keys that exist.
    pub fn require(&self, key: &str) -> Result<Scalar, FileError> {
        if let Some(v) = self.get(key)? {
            return Ok(v);
        }
        let available = match self.find(key)? {
            Found::Missing { parent, .. } => parent
                .map()
                .map(|m| m.entries.iter().map(|e| e.key.clone()).collect())
                .unwrap_or_default(),
            _ => Vec::new(),
        };
        Err(FileError::NoKey {
            path: self.path.clone(),
            key: key.to_string(),
            available,
        })
    }

    /// Replace the value at `key`, or insert the key (creating missing parent
    /// mappings) when it is absent. Everything else in the text is kept.
    pub fn set(&mut self, key: &str, value: &Scalar) -> Result<(), FileError> {
        let splices = self.plan_set(key, value)?;
        if splices.is_empty() {
            return Ok(());
        }
        let new_text = apply(&self.text, &splices);
        // Safety net: the edited text must parse and read back the new value.
        let reparsed = Doc::parse_as(&self.path, new_text, self.format).map_err(|e| {
            self.unsupported(
                key,
                format!("the edited file would not parse ({e}); left unchanged"),
            )
        })?;
        match reparsed.get(key) {
            Ok(Some(v)) if same_value(&v, value) => {}
            other => {
                return Err(self.unsupported(
                    key,
                    format!(
                        "the edit did not read back as {value} (got {other:?}); left unchanged"
                    ),
                ));
            }
        }
        self.text = reparsed.text;
        self.root = reparsed.root;
        self.loose = reparsed.loose;
        Ok(())
    }

    fn plan_set(&self, key: &str, value: &Scalar) -> Result<Vec<Splice>, FileError> {
        if let Scalar::Float(x) = value
            && !x.is_finite()
        {
            return Err(self.unsupported(key, "only finite numbers can be written"));
        }
        let segs: Vec<&str> = key.split('.').collect();
        match self.find(key)? {
            Found::Value(node) => match &node.kind {
                Kind::Scalar(s) => {
                    if let Some(why) = &s.locked {
                        return Err(self.unsupported(key, why.clone()));
                    }
                    if same_value(&s.value, value) && same_kind(&s.value, value) {
                        return Ok(Vec::new());
                    }
                    let spelled = self
                        .original_spelling(&segs, value)
                        .or_else(|| exponent_style(&self.text[node.start..node.end], value));
                    let with = match spelled {
                        Some(raw) => raw,
                        None => {
                            let in_flow = self.format == Format::Yaml && self.in_flow(node.start);
                            render::literal(self.format, value, Some(s), in_flow)
                                .map_err(|why| self.unsupported(key, why.to_string()))?
                        }
                    };
                    Ok(vec![Splice {
                        start: node.start,
                        end: node.end,
                        with,
                    }])
                }
                Kind::Map(_) | Kind::Seq => Err(FileError::NotScalar {
                    path: self.path.clone(),
                    key: key.to_string(),
                }),
                Kind::Opaque(why) => Err(self.unsupported(key, why.clone())),
            },
            Found::Missing {
                matched,
                parent,
                chain,
            } => self.plan_insert(key, &segs, matched, parent, &chain, value),
            Found::Blocked { at, node, chain } => {
                let empty_null = matches!(
                    &node.kind,
                    Kind::Scalar(ScalarNode {
                        value: Scalar::Null,
                        ..
                    })
                ) && node.start == node.end;
                if chain.is_empty() {
                    Err(self.unsupported(key, "the file's top level is not a mapping"))
                } else if self.format == Format::Yaml && empty_null {
                    // `parent:` with nothing after it: add the children below it.
                    let entry = chain[at];
                    yaml::insert_under_empty(self, entry, &segs[at + 1..], value)
                        .map_err(|why| self.unsupported(key, why.to_string()))
                } else {
                    Err(self.unsupported(
                        key,
                        format!(
                            "{} holds a value ({}), not a mapping; refusing to replace it",
                            segs[..=at].join("."),
                            &self.text[node.start..node.end]
                        ),
                    ))
                }
            }
        }
    }

    fn plan_insert(
        &self,
        key: &str,
        segs: &[&str],
        matched: usize,
        parent: &Node,
        chain: &[&Entry],
        value: &Scalar,
    ) -> Result<Vec<Splice>, FileError> {
        let rest = &segs[matched..];
        let res = match self.format {
            Format::Json => json::insert(self, parent, rest, value),
            Format::Yaml => yaml::insert(self, parent, chain, rest, value),
            Format::Toml => toml::insert(&self.text, &segs[..matched], rest, value),
            Format::Python => python::insert(self, matched, rest, value),
        };
        res.map_err(|why| self.unsupported(key, why.to_string()))
    }

    /// When `value` is the value the key had in the original text, that text
    /// (so setting a value back restores the file byte for byte: `6e-4`
    /// stays `6e-4`, `~` stays `~`).
    fn original_spelling(&self, segs: &[&str], value: &Scalar) -> Option<String> {
        let Found::Value(node) = lookup(&self.original_root, segs) else {
            return None;
        };
        match &node.kind {
            Kind::Scalar(s) if same_value(&s.value, value) && same_kind(&s.value, value) => {
                Some(self.original[node.start..node.end].to_string())
            }
            _ => None,
        }
    }

    /// Whether a byte offset lies inside a YAML flow collection.
    fn in_flow(&self, offset: usize) -> bool {
        fn walk(n: &Node, off: usize) -> bool {
            if let Kind::Map(m) = &n.kind {
                if let (Some(o), Some(c)) = (m.open, m.close)
                    && o < off
                    && off < c
                {
                    return true;
                }
                return m.entries.iter().any(|e| walk(&e.value, off));
            }
            false
        }
        // Flow sequences hold no addressable keys, so only maps matter.
        walk(&self.root, offset)
    }
}

fn build(format: Format, text: &str) -> Result<(Node, Vec<Node>), ParseErr> {
    match format {
        Format::Json => json::parse(text).map(|n| (n, Vec::new())),
        Format::Yaml => yaml::parse(text).map(|n| (n, Vec::new())),
        Format::Toml => toml::parse(text).map(|n| (n, Vec::new())),
        Format::Python => python::parse(text),
    }
}

/// A whole number written over a number in exponent form (`2e0`, `1E3`) keeps that
/// form: `4e0`. `None` when the old text has no exponent or the value is not whole.
fn exponent_style(old: &str, value: &Scalar) -> Option<String> {
    let Scalar::Float(x) = value else {
        return None;
    };
    let e = old.trim().chars().find(|c| matches!(c, 'e' | 'E'))?;
    if !old
        .trim()
        .starts_with(|c: char| c.is_ascii_digit() || c == '-')
    {
        return None; // not a number (a string, `.inf`)
    }
    (x.is_finite() && x.fract() == 0.0 && x.abs() < 9.0e15).then(|| format!("{}{e}0", *x as i64))
}

/// Values equal for knob purposes (an integral float equals the integer).
fn same_value(a: &Scalar, b: &Scalar) -> bool {
    match (a, b) {
        (Scalar::Int(i), Scalar::Float(x)) | (Scalar::Float(x), Scalar::Int(i)) => {
            (*i as f64) == *x
        }
        _ => a == b,
    }
}

fn same_kind(a: &Scalar, b: &Scalar) -> bool {
    std::mem::discriminant(a) == std::mem::discriminant(b)
}

/// A unified diff (`---`/`+++` headers with the two labels, `@@` hunks, 3 lines
/// of context) between two texts; empty when they are equal.
pub fn unified_diff(old_label: &str, new_label: &str, old: &str, new: &str) -> String {
    if old == new {
        return String::new();
    }
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(3)
        .header(old_label, new_label)
        .to_string()
}
