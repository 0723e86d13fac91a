//! The options a Python script's own `argparse` parser accepts, read from the
//! script's source without running it: so that oomguard adds a flag only where the
//! program accepts it (`--gradient_accumulation_steps` to a script whose parser
//! lacks it ends the relaunch with "unrecognized arguments").
//!
//! Only a parser the source shows whole is read: an `argparse.ArgumentParser`
//! whose every `add_argument` names its options as string literals, parsed with
//! `parse_args` (not `parse_known_args`, which lets unknown options through), and
//! never handed to other code (`add_args(parser)`, `return parser`, `parents=`)
//! that could add options the source does not show. Anything else (Hugging Face's
//! `HfArgumentParser` and dataclasses, click, jsonargparse, a script that imports its
//! parser) cannot be told here: the flag is added as before, and a refusal is
//! recognised afterwards (`evidence::refused`).

use std::io::Read;
use std::path::Path;

/// A script is read up to this size; a longer one is not read at all.
const MAX_SCRIPT_BYTES: u64 = 4 << 20;

/// The options of a script's argparse parser, as its source shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptOptions {
    /// Every option string of every `add_argument` call (`--lr`, `-b`).
    pub options: Vec<String>,
}

impl ScriptOptions {
    /// Whether the parser has the option `flag`, spelled so. (argparse also takes an
    /// unambiguous prefix of a longer option, which is never relied on: it may mean
    /// something else.)
    pub fn accepts(&self, flag: &str) -> bool {
        self.options.iter().any(|o| o == flag)
    }
}

/// The script at `path`, read as untrusted input: opened without blocking (a FIFO
/// never waits), a regular file of at most [`MAX_SCRIPT_BYTES`] in UTF-8. `None`:
/// it cannot be read, or its source does not show its parser whole.
pub fn read(path: &Path) -> Option<ScriptOptions> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() > MAX_SCRIPT_BYTES {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(MAX_SCRIPT_BYTES + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    if bytes.len() as u64 > MAX_SCRIPT_BYTES {
        return None;
    }
    parse(&String::from_utf8(bytes).ok()?)
}

/// Signs that options may come from somewhere the source does not show, or that
/// unknown options are let through.
const OPEN: &[&str] = &[
    "parse_known_args",
    "parse_known_intermixed_args",
    "HfArgumentParser",
    "TrlParser",
    "jsonargparse",
    "parents=",
    "fromfile_prefix_chars",
    "add_subparsers",
    "import click",
    "from click",
    "import typer",
    "import fire",
    "simple_parsing",
    "LightningCLI",
    "hydra",
    "exec(",
    "eval(",
];

/// The options of the script whose source is `src`, when its parser is all there.
pub fn parse(src: &str) -> Option<ScriptOptions> {
    let (code, bare) = split_code(src);
    let argparse = bare.contains("import argparse") || bare.contains("from argparse import");
    if !argparse || !bare.contains("ArgumentParser(") || !bare.contains("parse_args(") {
        return None;
    }
    if OPEN.iter().any(|w| bare.contains(w)) {
        return None;
    }
    // Each parser and argument group, by the name it is assigned to, is used only
    // through its methods: handed to a function or returned, it may gain options
    // elsewhere.
    let mut names = Vec::new();
    for ctor in [
        "ArgumentParser(",
        ".add_argument_group(",
        ".add_mutually_exclusive_group(",
    ] {
        let mut from = 0;
        while let Some(i) = bare[from..].find(ctor) {
            let at = from + i;
            from = at + ctor.len();
            names.push(assigned_to(&bare[..at])?);
        }
    }
    if names.iter().any(|n| escapes(&bare, n)) {
        return None;
    }
    let mut options = Vec::new();
    let mut from = 0;
    while let Some(i) = code[from..].find("add_argument(") {
        let args_at = from + i + "add_argument(".len();
        let args = call_args(&code[args_at..])?;
        from = args_at + args.len();
        let literals = string_literals(args)?;
        // The first argument must be a literal: `add_argument(*names)`,
        // `add_argument(f"--{k}")` or a variable cannot be read.
        if !args.trim_start().starts_with(['"', '\'']) {
            return None;
        }
        options.extend(literals.into_iter().filter(|l| l.starts_with('-')));
    }
    Some(ScriptOptions { options })
}

/// The name a constructor call at the end of `before` is assigned to
/// (`parser = argparse.` → `parser`); `None` when it is not a plain assignment.
fn assigned_to(before: &str) -> Option<String> {
    let line = before.rsplit('\n').next().unwrap_or(before);
    // `argparse.ArgumentParser(`, `parser.add_argument_group(`: drop the qualifier.
    let line = line.trim_end_matches(|c: char| c.is_alphanumeric() || c == '_' || c == '.');
    let (lhs, rest) = line.rsplit_once('=')?;
    if !rest.trim().is_empty() || lhs.ends_with(['=', '!', '<', '>']) {
        return None;
    }
    let name = lhs.trim();
    let ident = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_alphanumeric() || c == '_');
    ident.then(|| name.to_string())
}

/// Whether `name` is used other than through its attributes (`name.x`) or in
/// its own assignment (`name = ...`).
fn escapes(code: &str, name: &str) -> bool {
    let part = |c: char| c.is_alphanumeric() || c == '_';
    let mut from = 0;
    while let Some(i) = code[from..].find(name) {
        let at = from + i;
        let end = at + name.len();
        from = end;
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| part(c) || c == '.') || code[end..].starts_with(part) {
            continue; // part of another name, or an attribute of something else
        }
        let after = code[end..].trim_start_matches([' ', '\t']);
        if after.starts_with('.') || (after.starts_with('=') && !after.starts_with("==")) {
            continue;
        }
        return true;
    }
    false
}

/// The text of a call's arguments, up to (not including) its closing parenthesis.
fn call_args(s: &str) -> Option<&str> {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        if let Some(q) = quote {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                _ if c == q => quote = None,
                _ => {}
            }
            continue;
        }
        match c {
            '"' | '\'' => quote = Some(c),
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' if depth > 0 => depth -= 1,
            ')' => return Some(&s[..i]),
            _ => {}
        }
    }
    None
}

/// The plain string literals in `s` (`None` when one is an f-string or has an
/// escape: what it says cannot be told from the text).
fn string_literals(s: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        if c != '"' && c != '\'' {
            continue;
        }
        let prefix = s[..i].chars().next_back().filter(|p| p.is_alphanumeric());
        if prefix.is_some_and(|p| matches!(p, 'f' | 'F')) {
            return None;
        }
        let mut lit = String::new();
        loop {
            let (_, d) = chars.next()?;
            if d == '\\' {
                return None;
            }
            if d == c {
                break;
            }
            lit.push(d);
        }
        out.push(lit);
    }
    Some(out)
}

/// `src` without `#` comments, and the same with every string literal's content
/// blanked (docstrings, help texts), for looking at the code alone.
fn split_code(src: &str) -> (String, String) {
    let (mut code, mut bare) = (String::with_capacity(src.len()), String::new());
    let mut chars = src.chars().peekable();
    let mut in_comment = false;
    // The string being read: its quote and whether it is triple-quoted.
    let mut string: Option<(char, bool)> = None;
    while let Some(c) = chars.next() {
        if in_comment {
            if c == '\n' {
                in_comment = false;
                code.push(c);
                bare.push(c);
            }
            continue;
        }
        match string {
            None => match c {
                '#' => in_comment = true,
                '"' | '\'' => {
                    let mut triple = false;
                    if chars.peek() == Some(&c) {
                        chars.next();
                        if chars.peek() == Some(&c) {
                            chars.next();
                            triple = true;
                        } else {
                            // An empty string.
                            code.extend([c, c]);
                            bare.extend([c, c]);
                            continue;
                        }
                    }
                    let n = if triple { 3 } else { 1 };
                    code.extend(std::iter::repeat_n(c, n));
                    bare.extend(std::iter::repeat_n(c, n));
                    string = Some((c, triple));
                }
                _ => {
                    code.push(c);
                    bare.push(c);
                }
            },
            Some((q, triple)) => {
                code.push(c);
                if c == '\\' {
                    if let Some(d) = chars.next() {
                        code.push(d);
                    }
                    bare.push_str("  ");
                    continue;
                }
                if c == q
                    && (!triple
                        || (chars.peek() == Some(&q) && {
                            let mut ahead = chars.clone();
                            ahead.next();
                            ahead.peek() == Some(&q)
                        }))
                {
                    if triple {
                        chars.next();
                        chars.next();
                        code.extend([q, q]);
                        bare.extend([q, q]);
                    }
                    bare.push(q);
                    string = None;
                } else if c == '\n' && !triple {
                    // An unterminated one-line string: the line ends it.
                    bare.push(c);
                    string = None;
                } else {
                    bare.push(if c == '\n' { '\n' } else { ' ' });
                }
            }
        }
    }
    (code, bare)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: &str = r#""""Train. Its parser is all here; it's read, not run (# not a comment)."""
import argparse  # the standard library's

def main():
    parser = argparse.ArgumentParser(description="train (see --help)")
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument(
        "--output_dir", '-o',
        default="out",
        help="where checkpoints go (default: %(default)s)",
    )
    group = parser.add_argument_group("memory")
    group.add_argument("--gradient_checkpointing", action="store_true")
    args = parser.parse_args()
    # parser.add_argument("--gradient_accumulation_steps")
    return args
"#;

    #[test]
    fn a_plain_argparse_parser_is_read_from_the_source() {
        let o = parse(PLAIN).expect("the parser is all in the source");
        assert_eq!(
            o.options,
            [
                "--per_device_train_batch_size",
                "--output_dir",
                "-o",
                "--gradient_checkpointing"
            ]
        );
        assert!(o.accepts("--gradient_checkpointing"));
        assert!(!o.accepts("--gradient_accumulation_steps"));
        assert!(!o.accepts("--output"));
    }

    /// Where options may come from elsewhere, or unknown ones are let through, the
    /// source cannot tell: `None`.
    #[test]
    fn a_parser_the_source_does_not_show_whole_cannot_be_told() {
        for (what, src) in [
            (
                "handed to a helper",
                PLAIN.replace("    args = parser", "    add_args(parser)\n    args = parser"),
            ),
            (
                "returned",
                PLAIN.replace("    return args", "    return parser"),
            ),
            (
                "known args only",
                PLAIN.replace(".parse_args()", ".parse_known_args()[0]"),
            ),
            (
                "a name from a variable",
                PLAIN.replace("\"--output_dir\", '-o'", "name, '-o'"),
            ),
            (
                "an f-string",
                PLAIN.replace("\"--output_dir\", '-o'", "f\"--{k}\", '-o'"),
            ),
            (
                "HfArgumentParser",
                "from transformers import HfArgumentParser\nimport argparse\np = HfArgumentParser(X)\np.parse_args()".into(),
            ),
            ("no parser", "import sys\nprint(sys.argv)\n".into()),
        ] {
            assert_eq!(parse(&src), None, "{what}");
        }
    }

    #[test]
    fn a_script_that_is_not_a_regular_file_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("train.py");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert_eq!(read(&fifo), None);
        assert_eq!(read(dir.path()), None);
        let file = dir.path().join("t.py");
        std::fs::write(&file, PLAIN).unwrap();
        assert!(read(&file).is_some());
    }
}
