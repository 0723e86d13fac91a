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
//!
//! One option's own `add_argument` call is also read on its own, whole parser or not:
//! its `help=` (whether a `--train_batch_size` counts per device) and its literal
//! `default=` or `action="store_true"` (the value of an option the command leaves out).

use std::io::Read;
use std::path::Path;

/// A script is read up to this size; a longer one is not read at all.
pub const MAX_SCRIPT_BYTES: u64 = 4 << 20;

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

/// The first [`MAX_SCRIPT_BYTES`] + 1 bytes of the script at `path`, read as untrusted
/// input: opened without blocking (a FIFO never waits), a regular file only. One byte
/// more than the cap says the file is longer.
pub fn script_head(path: &Path) -> Option<Vec<u8>> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !file.metadata().ok()?.is_file() {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(MAX_SCRIPT_BYTES + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}

/// The source of the script at `path` ([`script_head`]): at most [`MAX_SCRIPT_BYTES`],
/// in UTF-8; a longer one is not read at all.
pub fn source(path: &Path) -> Option<String> {
    let bytes = script_head(path)?;
    if bytes.len() as u64 > MAX_SCRIPT_BYTES {
        return None;
    }
    String::from_utf8(bytes).ok()
}

/// The `help=` text of the `add_argument` call in `src` that names `flag`, its
/// literals joined as Python joins adjacent ones (`help="Batch size (per device) "
/// "for the training dataloader."`). Read whether or not the parser is all there:
/// it only says what the flag means. `None`: no such call, or no literal help.
pub fn help_of(src: &str, flag: &str) -> Option<String> {
    let args = argument_call(src, flag)?;
    let at = keyword_at(&args, "help")?;
    let help = string_literals_lenient(adjacent_literals(&args[at..]));
    (!help.is_empty()).then(|| help.concat())
}

/// What an option gives when the command leaves it out, as its `add_argument` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgDefault {
    /// `default=4` (a literal whole number).
    Int(u64),
    /// `action="store_true"`: off unless given, bare.
    StoreTrue,
}

/// The default of the `add_argument` call in `src` that names `flag`; `None` when
/// there is no such call or its default is not a literal whole number or
/// `store_true` (`default=None`, a variable, an expression).
pub fn default_of(src: &str, flag: &str) -> Option<ArgDefault> {
    let args = argument_call(src, flag)?;
    if let Some(at) = keyword_at(&args, "action") {
        let action = string_literals_lenient(adjacent_literals(&args[at..]));
        return (action.first().map(String::as_str) == Some("store_true"))
            .then_some(ArgDefault::StoreTrue);
    }
    let at = keyword_at(&args, "default")?;
    let value: String = args[at..]
        .trim_start()
        .chars()
        .take_while(|c| !matches!(c, ',' | ')' | '\n'))
        .collect();
    value.trim().parse().ok().map(ArgDefault::Int)
}

/// The default of the `add_argument` call in `src` that names `flag`, when it is one
/// plain string literal (`default="sd-model-finetuned"`); `None` otherwise (no call,
/// `default=None`, an f-string, an expression).
pub fn text_default_of(src: &str, flag: &str) -> Option<String> {
    let args = argument_call(src, flag)?;
    let value = args[keyword_at(&args, "default")?..].trim_start();
    if !value.starts_with(['"', '\'']) {
        return None;
    }
    let literals = adjacent_literals(value);
    let rest = value[literals.len()..].trim_start();
    if !(rest.is_empty() || rest.starts_with(',')) {
        return None;
    }
    let mut texts = string_literals_lenient(literals);
    (texts.len() == 1).then(|| texts.remove(0))
}

/// The arguments of the `add_argument` call in `src` whose option names include `flag`.
fn argument_call(src: &str, flag: &str) -> Option<String> {
    let (code, _) = split_code(src);
    let mut from = 0;
    while let Some(i) = code[from..].find("add_argument(") {
        let args_at = from + i + "add_argument(".len();
        let args = call_args(&code[args_at..])?;
        from = args_at + args.len();
        // The option names come before the first keyword argument.
        let names_end = args.find('=').unwrap_or(args.len());
        if string_literals_lenient(&args[..names_end])
            .iter()
            .any(|n| n == flag)
        {
            return Some(args.to_string());
        }
    }
    None
}

/// Where the value of keyword argument `kw=` begins in a call's arguments.
fn keyword_at(args: &str, kw: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = args[from..].find(kw) {
        let at = from + i;
        from = at + kw.len();
        let before = args[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = args[from..].trim_start();
        if let Some(value) = rest.strip_prefix('=')
            && !value.starts_with('=')
        {
            return Some(args.len() - value.len());
        }
    }
    None
}

/// Where a scan of Python source stands with respect to string literals.
#[derive(Default)]
struct Quotes {
    open: Option<char>,
    escaped: bool,
}

impl Quotes {
    /// Takes the next character: whether it belongs to a literal (its quotes included).
    fn inside(&mut self, c: char) -> bool {
        if let Some(q) = self.open {
            match c {
                _ if self.escaped => self.escaped = false,
                '\\' => self.escaped = true,
                _ if c == q => self.open = None,
                _ => {}
            }
            return true;
        }
        if c == '"' || c == '\'' {
            self.open = Some(c);
            return true;
        }
        false
    }
}

/// The run of adjacent string literals (in parentheses or not) that `s` begins with.
fn adjacent_literals(s: &str) -> &str {
    let mut quotes = Quotes::default();
    for (i, c) in s.char_indices() {
        if quotes.inside(c) {
            continue;
        }
        match c {
            c if c.is_whitespace() || c == '(' => {}
            // String prefixes (`r"..."`, `f"..."`).
            'r' | 'R' | 'f' | 'F' | 'u' | 'U' | 'b' | 'B' => {}
            _ => return &s[..i],
        }
    }
    s
}

/// The string literals in `s`, escapes and f-strings taken as written (for reading
/// what a help text says, not what a name is).
fn string_literals_lenient(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '"' && c != '\'' {
            continue;
        }
        let mut lit = String::new();
        let mut escaped = false;
        for d in chars.by_ref() {
            if escaped {
                escaped = false;
                lit.push(d);
            } else if d == '\\' {
                escaped = true;
            } else if d == c {
                break;
            } else {
                lit.push(d);
            }
        }
        out.push(lit);
    }
    out
}

/// What a batch flag's help text says it counts: `Some(true)` per device ("Batch size
/// (per device) for the training dataloader", "batch size per GPU (effective batch
/// size is ...)"), `Some(false)` the global batch ("total batch size across all
/// GPUs"), `None` neither. The first of the two kinds of words decides: a per-device
/// help goes on to say what the global batch is, and the other way round.
pub fn batch_help_per_device(help: &str) -> Option<bool> {
    let h = help.to_ascii_lowercase().replace(['-', '_'], " ");
    let first = |words: &[&str]| words.iter().filter_map(|w| h.find(w)).min();
    let device = first(&[
        "per device",
        "per gpu",
        "per process",
        "per rank",
        "per replica",
        "per core",
        "per accelerator",
        "each device",
        "each gpu",
        "each process",
        "each rank",
        "single device",
        "single gpu",
        "one gpu",
        "one device",
        "micro batch",
        "local batch",
    ]);
    let global = first(&[
        "global",
        "total",
        "effective",
        "across",
        "all gpus",
        "all devices",
        "overall",
    ]);
    match (device, global) {
        (Some(d), Some(g)) => Some(d < g),
        (Some(_), None) => Some(true),
        (None, Some(_)) => Some(false),
        (None, None) => None,
    }
}

/// Signs that options may come from somewhere the source does not show, or that
/// unknown options are let through.
const OPEN: &[&str] = &[
    "parse_known_args",
    "parse_known_intermixed_args",
    "HfArgumentParser",
    "TrlParser",
    "jsonargparse",
    "fromfile_prefix_chars",
    "add_subparsers",
    "import click",
    "from click",
    "import typer",
    "import fire",
    "simple_parsing",
    "LightningCLI",
    "hydra",
];

/// Whether `code` calls the builtin `name` (`eval(`, `exec(`), not a method of that
/// name (`model.eval()`, which nearly every training script calls) or a longer name.
fn calls_builtin(code: &str, name: &str) -> bool {
    code.match_indices(name).any(|(at, _)| {
        !code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c == '.' || c == '_' || c.is_alphanumeric())
    })
}

/// The options of the script whose source is `src`, when its parser is all there.
pub fn parse(src: &str) -> Option<ScriptOptions> {
    let (code, bare) = split_code(src);
    let argparse = bare.contains("import argparse") || bare.contains("from argparse import");
    if !argparse || !bare.contains("ArgumentParser(") || !bare.contains("parse_args(") {
        return None;
    }
    if OPEN.iter().any(|w| bare.contains(w))
        || calls_builtin(&bare, "eval(")
        || calls_builtin(&bare, "exec(")
    {
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
            // `ArgumentParser(parents=[base])` inherits options from elsewhere (not
            // `path.mkdir(parents=True)`, which nearly every training script calls).
            if ctor == "ArgumentParser(" && call_args(&bare[from..])?.contains("parents") {
                return None;
            }
            names.push(assigned_to(&bare[..at])?);
        }
    }
    // DeepSpeed's `parser = deepspeed.add_config_arguments(parser)` (DeepSpeed-Chat,
    // DeepSpeedExamples) hands the parser over to add only its own options.
    let mut options = Vec::new();
    let mut handed = bare.to_string();
    for n in &names {
        let call = format!("deepspeed.add_config_arguments({n})");
        if handed.contains(&call) {
            handed = handed.replace(&call, "");
            options.extend(DEEPSPEED_CONFIG_ARGUMENTS.iter().map(|o| o.to_string()));
        }
    }
    if names.iter().any(|n| escapes(&handed, n)) {
        return None;
    }
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

/// The options `deepspeed.add_config_arguments(parser)` adds (DeepSpeed's
/// `deepspeed/__init__.py`: `_add_core_arguments`).
const DEEPSPEED_CONFIG_ARGUMENTS: &[&str] = &[
    "--deepspeed",
    "--deepspeed_config",
    "--deepscale",
    "--deepscale_config",
];

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
    let mut quotes = Quotes::default();
    for (i, c) in s.char_indices() {
        if quotes.inside(c) {
            continue;
        }
        match c {
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
pub(crate) fn split_code(src: &str) -> (String, String) {
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
            (
                "options that eval builds",
                PLAIN.replace("    return args", "    eval(code)\n    return args"),
            ),
        ] {
            assert_eq!(parse(&src), None, "{what}");
        }
        // A model's `.eval()` (nearly every training script's validation) is no eval.
        let validates = PLAIN.replace("    return args", "    model.eval()\n    return args");
        assert!(parse(&validates).is_some());
        // A parser built on others' options (`parents=`) cannot be told; a folder made
        // with `mkdir(parents=True)` (diffusers' dreambooth, most scripts) is no parser's.
        let inherits = PLAIN.replace("ArgumentParser(", "ArgumentParser(parents=[base], ");
        assert!(inherits.contains("parents=[base]"));
        assert_eq!(parse(&inherits), None);
        // DeepSpeed-Chat: the parser goes through deepspeed.add_config_arguments, which
        // adds only DeepSpeed's own options.
        let ds = PLAIN.replace(
            "    args = parser",
            "    parser = deepspeed.add_config_arguments(parser)\n    args = parser",
        );
        assert!(ds.contains("deepspeed.add_config_arguments(parser)"));
        let o = parse(&ds).expect("a DeepSpeed-Chat parser is read whole");
        assert!(o.accepts("--deepspeed") && o.accepts("--gradient_checkpointing"));
        let other = ds.replace("deepspeed.add_config_arguments(parser)", "add_args(parser)");
        assert_eq!(parse(&other), None);
        let mkdir = PLAIN.replace(
            "    return args",
            "    Path(args.output_dir).mkdir(parents=True, exist_ok=True)\n    return args",
        );
        assert!(mkdir.contains("parents=True"));
        assert!(parse(&mkdir).is_some());
    }

    /// What a batch flag counts, read from its help as scripts in the wild write it
    /// (diffusers' examples, MAE/DeiT, and a global batch said so).
    #[test]
    fn a_batch_flags_help_says_whether_it_is_per_device() {
        let src = r#"import argparse
def parse_args(input_args=None):
    parser = argparse.ArgumentParser(description="Simple example of a training script.")
    # parser.add_argument("--batch_size", help="Total batch size")
    parser.add_argument(
        "--train_batch_size", type=int, default=16, help="Batch size (per device) for the training dataloader."
    )
    parser.add_argument('--batch_size', default=64, type=int,
                        help='Batch size per GPU (effective batch size is batch_size * accum_iter * # gpus')
    parser.add_argument("--bs", type=int, help=(
        "Total batch size across all GPUs; "
        "each GPU gets bs / world_size"
    ))
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--train-batch-size", type=int, help=f"batch for {'the'} run")
    if input_args is not None:
        return parser.parse_args(input_args)
    return parser.parse_args()
"#;
        let help = |f: &str| help_of(src, f);
        assert_eq!(
            help("--train_batch_size").as_deref(),
            Some("Batch size (per device) for the training dataloader.")
        );
        assert_eq!(
            help("--bs").as_deref(),
            Some("Total batch size across all GPUs; each GPU gets bs / world_size")
        );
        assert_eq!(help("--batch-size"), None, "no help");
        assert_eq!(help("--max_steps"), None, "no such flag");
        let says = |f: &str| help(f).and_then(|h| batch_help_per_device(&h));
        assert_eq!(says("--train_batch_size"), Some(true));
        assert_eq!(says("--batch_size"), Some(true), "per GPU comes first");
        assert_eq!(says("--bs"), Some(false), "total comes first");
        assert_eq!(says("--train-batch-size"), None, "says neither");
        assert_eq!(batch_help_per_device("per-device batch size"), Some(true));
        assert_eq!(batch_help_per_device("the global batch"), Some(false));
        assert_eq!(batch_help_per_device("Micro-batch size"), Some(true));
        // PyTorch's ImageNet example: the node's total, divided among its GPUs.
        assert_eq!(
            batch_help_per_device(
                "mini-batch size (default: 256), this is the total batch size of all GPUs on the current node when using Data Parallel or Distributed Data Parallel"
            ),
            Some(false)
        );
        assert_eq!(
            batch_help_per_device("Input batch size for training (default: 128)"),
            None
        );
    }

    /// The defaults that let oomguard add an option the command leaves out.
    #[test]
    fn an_options_default_is_read_only_when_literal() {
        let src = r#"import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--gradient_accumulation_steps", type=int, default=1, help="default=8 here is help")
parser.add_argument("--grad_accum", type=int, default=ACCUM)
parser.add_argument("--accum", type=int)
parser.add_argument(
    "--gradient_checkpointing",
    action="store_true",
)
parser.add_argument("--no_ckpt", action="store_false")
args = parser.parse_args()
"#;
        assert_eq!(
            default_of(src, "--gradient_accumulation_steps"),
            Some(ArgDefault::Int(1))
        );
        assert_eq!(default_of(src, "--grad_accum"), None, "a variable");
        assert_eq!(default_of(src, "--accum"), None, "argparse's None");
        assert_eq!(
            default_of(src, "--gradient_checkpointing"),
            Some(ArgDefault::StoreTrue)
        );
        assert_eq!(default_of(src, "--no_ckpt"), None);
        let dirs = r#"p.add_argument("--output_dir", type=str, default="sd-model-finetuned", help="where")
p.add_argument("--logging_dir", default=os.path.join("a", "b"))
p.add_argument("--cache_dir", default=None)
p.add_argument("--run_dir", default="runs/" + NAME)
p.add_argument("--tmp_dir", default=f"/tmp/{user}")
"#;
        assert_eq!(
            text_default_of(dirs, "--output_dir").as_deref(),
            Some("sd-model-finetuned")
        );
        for flag in ["--logging_dir", "--cache_dir", "--run_dir", "--tmp_dir"] {
            assert_eq!(text_default_of(dirs, flag), None, "{flag}");
        }
        assert_eq!(default_of(src, "--missing"), None);
    }

    #[test]
    fn a_script_that_is_not_a_regular_file_is_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("train.py");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert_eq!(source(&fifo), None);
        assert_eq!(source(dir.path()), None);
        let file = dir.path().join("t.py");
        std::fs::write(&file, PLAIN).unwrap();
        assert!(source(&file).as_deref().and_then(parse).is_some());
    }
}
