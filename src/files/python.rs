//! Python config modules (`config/*.py` exec'd by a script): a small tokenizer finds
//! top-level `NAME = literal` assignments and `"key": literal` entries of dict
//! literals anywhere in the file. Anything that is not a literal (`5 * 8`, a
//! call, a name) can be read as "unsupported, with the expression" only.
//!
//! "Validation" is lexical: strings must be closed and brackets balanced; the
//! file is not checked against the full Python grammar.

use super::{
    CannotWrite, Doc, Entry, Format, Kind, Map, Node, ParseErr, Scalar, ScalarNode, Splice, Style,
    line_col, newline_of, render,
};

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Name(String),
    Num,
    /// A plain string literal (no f/b prefix) with its value and quote.
    Str(String, char),
    /// A string we cannot treat as a literal (f-string, bytes, triple-quoted).
    OtherStr,
    Op(char),
    /// End of a logical line (at bracket depth 0).
    Newline,
}

#[derive(Debug, Clone)]
struct Token {
    tok: Tok,
    start: usize,
    end: usize,
    /// Whether this token starts a logical line at column 0.
    top: bool,
}

fn err(text: &str, at: usize, msg: impl Into<String>) -> ParseErr {
    let (line, col) = line_col(text, at);
    ParseErr {
        line,
        col,
        message: msg.into(),
    }
}

/// The tokens of `text`: blanks, comments and line continuations dropped, a
/// `Newline` at the end of each logical line; brackets must balance.
fn tokenize(text: &str) -> Result<Vec<Token>, ParseErr> {
    let b = text.as_bytes();
    let mut toks: Vec<Token> = Vec::new();
    let mut i = 0;
    let mut brackets: Vec<(u8, usize)> = Vec::new();
    let mut at_line_start = true;
    let mut line_col0 = true;
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            if brackets.is_empty()
                && !matches!(
                    toks.last(),
                    None | Some(Token {
                        tok: Tok::Newline,
                        ..
                    })
                )
            {
                toks.push(Token {
                    tok: Tok::Newline,
                    start: i,
                    end: i,
                    top: false,
                });
            }
            if brackets.is_empty() {
                at_line_start = true;
                line_col0 = true;
            }
            i += 1;
            continue;
        }
        if c == b' ' || c == b'\t' || c == b'\r' || c == b'\x0c' {
            if at_line_start {
                line_col0 = false;
            }
            i += 1;
            continue;
        }
        if c == b'#' {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        if c == b'\\' && b.get(i + 1) == Some(&b'\n') {
            i += 2;
            continue;
        }
        if c == b'\\' && b.get(i + 1) == Some(&b'\r') && b.get(i + 2) == Some(&b'\n') {
            i += 3;
            continue;
        }
        let top = at_line_start && line_col0;
        at_line_start = false;
        let start = i;
        let (tok, end) = token(text, i, &mut brackets)?;
        i = end;
        toks.push(Token {
            tok,
            start,
            end: i,
            top,
        });
    }
    if let Some((open, at)) = brackets.pop() {
        return Err(err(text, at, format!("`{}` is never closed", open as char)));
    }
    toks.push(Token {
        tok: Tok::Newline,
        start: b.len(),
        end: b.len(),
        top: false,
    });
    Ok(toks)
}

/// The token starting at `i` (not a blank, comment or line break) and where it
/// ends; brackets are pushed on and popped off `brackets` (open bracket, offset).
fn token(text: &str, i: usize, brackets: &mut Vec<(u8, usize)>) -> Result<(Tok, usize), ParseErr> {
    let b = text.as_bytes();
    let c = b[i];
    if c == b'"' || c == b'\'' {
        string(text, i, "")
    } else if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 {
        name_or_prefixed_string(text, i)
    } else if c.is_ascii_digit() || (c == b'.' && b.get(i + 1).is_some_and(u8::is_ascii_digit)) {
        Ok((Tok::Num, number_end(text, i)))
    } else {
        match c {
            b'(' | b'[' | b'{' => brackets.push((c, i)),
            b')' | b']' | b'}' => close_bracket(text, i, brackets)?,
            _ => {}
        }
        let ch = text[i..].chars().next().unwrap_or('?');
        Ok((Tok::Op(ch), i + ch.len_utf8()))
    }
}

/// A name starting at `i`, or a string literal with a prefix (`f"…"`, `rb'…'`).
fn name_or_prefixed_string(text: &str, i: usize) -> Result<(Tok, usize), ParseErr> {
    let b = text.as_bytes();
    let mut j = i;
    while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_' || b[j] >= 0x80) {
        j += 1;
    }
    let word = &text[i..j];
    if j < b.len()
        && (b[j] == b'"' || b[j] == b'\'')
        && word.len() <= 2
        && word.chars().all(|c| "rRbBuUfF".contains(c))
    {
        string(text, j, word)
    } else {
        Ok((Tok::Name(word.to_string()), j))
    }
}

/// Where the number starting at `i` ends (`1_000`, `0x1F`, `3e-4`, `2.5j`).
fn number_end(text: &str, i: usize) -> usize {
    let b = text.as_bytes();
    let mut j = i;
    while j < b.len() {
        let d = b[j];
        let sign_of_exponent = (d == b'-' || d == b'+')
            && matches!(b[j - 1], b'e' | b'E')
            && !text[i..j].starts_with("0x")
            && !text[i..j].starts_with("0X");
        if d.is_ascii_alphanumeric() || d == b'_' || d == b'.' || sign_of_exponent {
            j += 1;
        } else {
            break;
        }
    }
    j
}

/// The closing bracket at `i` must close the innermost open one.
fn close_bracket(text: &str, i: usize, brackets: &mut Vec<(u8, usize)>) -> Result<(), ParseErr> {
    let c = text.as_bytes()[i];
    let want = match c {
        b')' => b'(',
        b']' => b'[',
        _ => b'{',
    };
    match brackets.pop() {
        Some((open, _)) if open == want => Ok(()),
        Some((open, at)) => {
            let (l, _) = line_col(text, at);
            Err(err(
                text,
                i,
                format!(
                    "`{}` does not close the `{}` opened on line {l}",
                    c as char, open as char
                ),
            ))
        }
        None => Err(err(text, i, format!("unmatched `{}`", c as char))),
    }
}

/// A string literal starting at `i` (the quote); `prefix` are its letters.
fn string(text: &str, i: usize, prefix: &str) -> Result<(Tok, usize), ParseErr> {
    let b = text.as_bytes();
    let q = b[i];
    let triple = b.get(i + 1) == Some(&q) && b.get(i + 2) == Some(&q);
    let raw = prefix.contains(['r', 'R']);
    if triple {
        let close = [q, q, q];
        let mut j = i + 3;
        while j < b.len() {
            if b[j] == b'\\' && !raw {
                j += 2;
                continue;
            }
            if b[j..].starts_with(&close) {
                return Ok((Tok::OtherStr, j + 3));
            }
            j += 1;
        }
        return Err(err(text, i, "unterminated triple-quoted string"));
    }
    let mut j = i + 1;
    let mut value = String::new();
    loop {
        let Some(c) = text[j..].chars().next() else {
            return Err(err(text, i, "unterminated string"));
        };
        if c == '\n' {
            return Err(err(text, i, "unterminated string (end of line)"));
        }
        j += c.len_utf8();
        if c as u32 == q as u32 {
            break;
        }
        if c == '\\' {
            let Some(e) = text[j..].chars().next() else {
                return Err(err(text, i, "unterminated string"));
            };
            j += e.len_utf8();
            if raw {
                value.push('\\');
                value.push(e);
                continue;
            }
            match e {
                'n' => value.push('\n'),
                't' => value.push('\t'),
                'r' => value.push('\r'),
                '\\' => value.push('\\'),
                '\'' => value.push('\''),
                '"' => value.push('"'),
                '\n' => {}
                '0' => value.push('\0'),
                other => {
                    value.push('\\');
                    value.push(other);
                }
            }
            continue;
        }
        value.push(c);
    }
    let plain = prefix.chars().all(|c| "rRuU".contains(c));
    let tok = if plain {
        Tok::Str(value, q as char)
    } else {
        Tok::OtherStr
    };
    Ok((tok, j))
}

fn number(raw: &str) -> Option<Scalar> {
    let clean = raw.replace('_', "");
    let lower = clean.to_ascii_lowercase();
    if let Some(h) = lower.strip_prefix("0x") {
        return i64::from_str_radix(h, 16).ok().map(Scalar::Int);
    }
    if let Some(o) = lower.strip_prefix("0o") {
        return i64::from_str_radix(o, 8).ok().map(Scalar::Int);
    }
    if let Some(bin) = lower.strip_prefix("0b") {
        return i64::from_str_radix(bin, 2).ok().map(Scalar::Int);
    }
    if lower.ends_with('j') {
        return None;
    }
    if !lower.contains(['.', 'e']) {
        return lower.parse::<i64>().ok().map(Scalar::Int);
    }
    lower.parse::<f64>().ok().map(Scalar::Float)
}

/// A symbol of constant integer arithmetic: a number or an operator/bracket.
#[derive(Clone, Copy, PartialEq)]
enum Sym {
    N(i64),
    Op(&'static str),
}

/// Evaluates constant integer arithmetic over symbols: None on overflow or
/// when the symbols are not one whole expression.
///
/// Recursive descent: sum := term (('+'|'-') term)*; term := unary (('*'|'//'|'%') unary)*;
/// unary := '-' unary | power; power := atom ('**' unary)?; atom := N | '(' sum ')'.
struct Arith<'a> {
    s: &'a [Sym],
    p: usize,
}

impl<'a> Arith<'a> {
    /// The value of all of `syms`, or None.
    fn eval(syms: &'a [Sym]) -> Option<i64> {
        let mut r = Arith { s: syms, p: 0 };
        let v = r.sum()?;
        (r.p == syms.len()).then_some(v)
    }

    fn peek(&self) -> Option<Sym> {
        self.s.get(self.p).copied()
    }

    fn eat(&mut self, op: &'static str) -> bool {
        let hit = self.peek() == Some(Sym::Op(op));
        if hit {
            self.p += 1;
        }
        hit
    }

    fn sum(&mut self) -> Option<i64> {
        let mut v = self.term()?;
        loop {
            if self.eat("+") {
                v = v.checked_add(self.term()?)?;
            } else if self.eat("-") {
                v = v.checked_sub(self.term()?)?;
            } else {
                return Some(v);
            }
        }
    }

    fn term(&mut self) -> Option<i64> {
        let mut v = self.unary()?;
        loop {
            if self.eat("*") {
                v = v.checked_mul(self.unary()?)?;
            } else if self.eat("//") {
                v = v.checked_div_euclid(self.unary()?)?;
            } else if self.eat("%") {
                v = v.checked_rem_euclid(self.unary()?)?;
            } else {
                return Some(v);
            }
        }
    }

    fn unary(&mut self) -> Option<i64> {
        if self.eat("-") {
            return self.unary()?.checked_neg();
        }
        if self.eat("+") {
            return self.unary();
        }
        let base = self.atom()?;
        if self.eat("**") {
            let e = u32::try_from(self.unary()?).ok()?;
            return base.checked_pow(e);
        }
        Some(base)
    }

    fn atom(&mut self) -> Option<i64> {
        match self.peek()? {
            Sym::N(n) => {
                self.p += 1;
                Some(n)
            }
            Sym::Op("(") => {
                self.p += 1;
                let v = self.sum()?;
                self.eat(")").then_some(v)
            }
            Sym::Op(_) => None,
        }
    }
}

struct P<'a> {
    text: &'a str,
    toks: Vec<Token>,
}

impl P<'_> {
    /// Index of the bracket closing the one at `i`.
    fn matching(&self, i: usize) -> usize {
        let mut depth = 0usize;
        for (j, t) in self.toks.iter().enumerate().skip(i) {
            match t.tok {
                Tok::Op('(' | '[' | '{') => depth += 1,
                Tok::Op(')' | ']' | '}') => {
                    depth -= 1;
                    if depth == 0 {
                        return j;
                    }
                }
                _ => {}
            }
        }
        self.toks.len() - 1
    }

    fn opaque(&self, lo: usize, hi: usize) -> Node {
        let (start, end) = if lo < hi {
            (self.toks[lo].start, self.toks[hi - 1].end)
        } else {
            (0, 0)
        };
        let expr = self.text[start..end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        Node {
            start,
            end,
            kind: Kind::Opaque(format!(
                "the value is the Python expression `{expr}`, not a literal; edit the file by hand or set the knob another way"
            )),
        }
    }

    /// The value made of tokens `lo..hi`.
    fn value(&self, lo: usize, hi: usize) -> Node {
        let t = &self.toks[lo..hi];
        let scalar = |v: Scalar, style: Style, start: usize, end: usize| Node {
            start,
            end,
            kind: Kind::Scalar(ScalarNode {
                value: v,
                style,
                locked: None,
                raw: self.text[start..end].to_string(),
            }),
        };
        match t {
            [one] => match &one.tok {
                Tok::Num => match number(&self.text[one.start..one.end]) {
                    Some(v) => scalar(v, Style::Plain, one.start, one.end),
                    None => self.opaque(lo, hi),
                },
                Tok::Str(s, q) => scalar(
                    Scalar::Str(s.clone()),
                    if *q == '"' {
                        Style::Double
                    } else {
                        Style::Single
                    },
                    one.start,
                    one.end,
                ),
                Tok::Name(n) if n == "True" => {
                    scalar(Scalar::Bool(true), Style::Plain, one.start, one.end)
                }
                Tok::Name(n) if n == "False" => {
                    scalar(Scalar::Bool(false), Style::Plain, one.start, one.end)
                }
                Tok::Name(n) if n == "None" => {
                    scalar(Scalar::Null, Style::Plain, one.start, one.end)
                }
                _ => self.opaque(lo, hi),
            },
            [sign, num]
                if matches!(sign.tok, Tok::Op('-'))
                    && num.tok == Tok::Num
                    && sign.end == num.start =>
            {
                match number(&self.text[sign.start..num.end]) {
                    Some(v) => scalar(v, Style::Plain, sign.start, num.end),
                    None => self.opaque(lo, hi),
                }
            }
            [first, ..] if first.tok == Tok::Op('{') && self.matching(lo) == hi - 1 => {
                self.dict(lo).unwrap_or_else(|| self.opaque(lo, hi))
            }
            [first, ..]
                if matches!(first.tok, Tok::Op('[' | '(')) && self.matching(lo) == hi - 1 =>
            {
                Node {
                    start: first.start,
                    end: t[t.len() - 1].end,
                    kind: Kind::Seq,
                }
            }
            _ => match self.arithmetic(lo, hi) {
                // `5 * 8`: read as 40; a new value replaces the whole expression.
                Some(n) => {
                    let (start, end) = (t[0].start, t[t.len() - 1].end);
                    scalar(Scalar::Int(n), Style::Plain, start, end)
                }
                None => self.opaque(lo, hi),
            },
        }
    }

    /// Constant integer arithmetic (`5 * 8`, `2**10`, `(4 + 4) // 2`) over
    /// tokens `lo..hi`; None for anything else (names, calls, `/`).
    fn arithmetic(&self, lo: usize, hi: usize) -> Option<i64> {
        let syms = self.symbols(lo, hi)?;
        if !syms.iter().any(|s| matches!(s, Sym::Op(_))) {
            return None;
        }
        Arith::eval(&syms)
    }

    /// Tokens `lo..hi` flattened to symbols: numbers, operators (`**` and `//`
    /// joined), brackets; None at a token that is none of these.
    fn symbols(&self, lo: usize, hi: usize) -> Option<Vec<Sym>> {
        let mut syms = Vec::new();
        let mut i = lo;
        while i < hi {
            let t = &self.toks[i];
            let next_adjacent = |c: char| {
                self.toks
                    .get(i + 1)
                    .filter(|n| i + 1 < hi && n.start == t.end && n.tok == Tok::Op(c))
                    .is_some()
            };
            match t.tok {
                Tok::Num => match number(&self.text[t.start..t.end])? {
                    Scalar::Int(n) => syms.push(Sym::N(n)),
                    _ => return None,
                },
                Tok::Op('*') if next_adjacent('*') => {
                    syms.push(Sym::Op("**"));
                    i += 1;
                }
                Tok::Op('/') if next_adjacent('/') => {
                    syms.push(Sym::Op("//"));
                    i += 1;
                }
                Tok::Op('*') => syms.push(Sym::Op("*")),
                Tok::Op('+') => syms.push(Sym::Op("+")),
                Tok::Op('-') => syms.push(Sym::Op("-")),
                Tok::Op('%') => syms.push(Sym::Op("%")),
                Tok::Op('(') => syms.push(Sym::Op("(")),
                Tok::Op(')') => syms.push(Sym::Op(")")),
                _ => return None,
            }
            i += 1;
        }
        Some(syms)
    }

    /// A dict literal `{ "k": v, ... }` at token `lo`, if it is one.
    fn dict(&self, lo: usize) -> Option<Node> {
        let hi = self.matching(lo);
        let mut map = Map {
            open: Some(self.toks[lo].start),
            close: Some(self.toks[hi].start),
            ..Map::default()
        };
        let mut i = lo + 1;
        while i < hi {
            let Tok::Str(key, q) = &self.toks[i].tok else {
                return None;
            };
            if self.toks.get(i + 1).map(|t| &t.tok) != Some(&Tok::Op(':')) {
                return None;
            }
            // The value runs to the next `,` at this depth (or the closing brace).
            let vlo = i + 2;
            let mut j = vlo;
            while j < hi {
                match self.toks[j].tok {
                    Tok::Op('(' | '[' | '{') => j = self.matching(j) + 1,
                    Tok::Op(',') => break,
                    _ => j += 1,
                }
            }
            if vlo >= j {
                return None;
            }
            map.entries.push(Entry {
                key: key.clone(),
                key_start: self.toks[i].start,
                key_quote: Some(*q),
                value: self.value(vlo, j),
            });
            i = j + 1;
        }
        Some(Node {
            start: self.toks[lo].start,
            end: self.toks[hi].end,
            kind: Kind::Map(map),
        })
    }
}

/// The module's top-level assignments (as the root mapping) and the dict
/// literals found elsewhere.
pub(crate) fn parse(text: &str) -> Result<(Node, Vec<Node>), ParseErr> {
    let p = P {
        text,
        toks: tokenize(text)?,
    };
    let mut root = Map::default();
    let mut covered = vec![false; p.toks.len()];
    let mut i = 0;
    while i < p.toks.len() {
        let mut end = i;
        while p.toks[end].tok != Tok::Newline {
            end += 1;
        }
        if p.toks[i].top
            && let Tok::Name(name) = &p.toks[i].tok
            && p.toks.get(i + 1).map(|t| &t.tok) == Some(&Tok::Op('='))
            && p.toks.get(i + 2).is_some_and(|t| t.tok != Tok::Op('='))
            && i + 2 < end
        {
            let value = p.value(i + 2, end);
            for c in covered.iter_mut().take(end).skip(i) {
                *c = true;
            }
            root.entries.push(Entry {
                key: name.clone(),
                key_start: p.toks[i].start,
                key_quote: None,
                value,
            });
        }
        i = end + 1;
    }
    let mut loose = Vec::new();
    let mut i = 0;
    while i < p.toks.len() {
        if !covered[i]
            && p.toks[i].tok == Tok::Op('{')
            && let Some(d) = p
                .dict(i)
                .filter(|d| matches!(&d.kind, Kind::Map(m) if !m.entries.is_empty()))
        {
            loose.push(d);
            i = p.matching(i) + 1;
            continue;
        }
        i += 1;
    }
    Ok((
        Node {
            start: 0,
            end: text.len(),
            kind: Kind::Map(root),
        },
        loose,
    ))
}

/// Add a missing top-level `NAME = value` at the end of the module. Missing
/// dict-literal keys are not added.
pub(crate) fn insert(
    doc: &Doc,
    matched: usize,
    rest: &[&str],
    value: &Scalar,
) -> Result<Vec<Splice>, CannotWrite> {
    if matched > 0 || rest.len() != 1 {
        return Err(CannotWrite::PythonNested);
    }
    let name = rest[0];
    if !name
        .chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
        || !name.chars().all(|c| c.is_alphanumeric() || c == '_')
    {
        return Err(CannotWrite::NotIdentifier(name.to_string()));
    }
    let text = doc.text();
    let nl = newline_of(text);
    let lit = render::literal(Format::Python, value, None, false)?;
    let lead = if text.is_empty() || text.ends_with('\n') {
        ""
    } else {
        nl
    };
    Ok(vec![Splice {
        start: text.len(),
        end: text.len(),
        with: format!("{lead}{name} = {lit}{nl}"),
    }])
}
