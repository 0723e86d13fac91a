//! The newest complete checkpoint for the framework at hand, and how to resume from it.
//!
//! Theory of operation: a family (`frameworks`) or a policy's `[resume]`
//! table says where a command keeps its checkpoints — one of the layouts of
//! [`Kind`] — and how it is told to resume. `find` lists the candidates
//! newest first and takes the first complete one:
//!
//! * every marker file present and non-empty;
//! * no temporary names (`*.tmp`, `tmp-*`, `*.incomplete`, `*.partial`);
//! * a single-file checkpoint (`.ckpt`, `.pt`) ends with a zip directory, as
//!   `torch.save` writes it last;
//! * not still being written: sizes and times stable over a short interval.
//!
//! Newer candidates that fail are reported with the reason. Checkpoints are
//! only ever read: never deleted, moved or renamed.

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::command::Command;

/// A checkpoint found on disk.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Checkpoint {
    pub path: PathBuf,
    pub step: u64,
}

/// A newer checkpoint that was not used, and why.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Skipped {
    pub path: PathBuf,
    pub why: String,
}

/// What a search found.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Found {
    pub layout: String,
    pub latest: Option<Checkpoint>,
    pub skipped: Vec<Skipped>,
}

/// A policy's `[resume]` table, for custom scripts:
///
/// ```toml
/// [resume]
/// flag = "--resume_from"          # how the script is told where to resume from
/// dir = "outputs/gsa-512m"        # or dir_flag = "--output_dir"
/// pattern = "step_{step}"         # checkpoint folder names, {step} is the number
/// complete_when = ["model.safetensors", "optimizer.pt"]
/// ```
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CustomSpec {
    pub flag: String,
    pub dir: Option<PathBuf>,
    pub dir_flag: Option<String>,
    pub pattern: String,
    #[serde(default)]
    pub complete_when: Vec<String>,
    /// How plan names the layout when a family (not a policy) describes it.
    #[serde(skip)]
    pub label: Option<String>,
}

/// How the framework is told to resume.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(tag = "how", rename_all = "snake_case")]
pub enum ResumeHow {
    /// `--flag PATH` (or `--flag=PATH` when `equals`), replacing an earlier value.
    Flag { flag: String, equals: bool },
    /// A fixed flag value that makes the script find the checkpoint itself (`--init_from=resume`).
    Const {
        flag: String,
        value: String,
        equals: bool,
    },
    /// A `key=value` override; `value` None means the path.
    Override { key: String, value: Option<String> },
    /// The framework resumes from its folder by itself (Megatron `--load` = `--save`).
    Automatic,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    HuggingFace,
    DeepSpeed,
    Megatron,
    Lightning,
    Torchtune,
    NanoGpt,
    Custom(CustomSpec),
}

/// Where a command keeps its checkpoints and how it resumes from one.
#[derive(Debug, Clone, Serialize)]
pub struct Layout {
    pub kind: Kind,
    pub root: PathBuf,
    pub how: ResumeHow,
    /// The resume path the user passed, if any: only a newer checkpoint replaces it.
    pub user_resume: Option<PathBuf>,
}

impl Layout {
    pub fn name(&self) -> &str {
        match &self.kind {
            Kind::HuggingFace => "hugging-face output_dir/checkpoint-N",
            Kind::DeepSpeed => "deepspeed latest → global_stepN",
            Kind::Megatron => "megatron latest_checkpointed_iteration.txt → iter_N",
            Kind::Lightning => "lightning *.ckpt",
            Kind::Torchtune => "torchtune output_dir with recipe_state.pt",
            Kind::NanoGpt => "nanogpt out_dir/ckpt.pt",
            Kind::Custom(spec) => spec
                .label
                .as_deref()
                .unwrap_or("custom (policy [resume] table)"),
        }
    }
}

// ---------------------------------------------------------------- the command

/// The layout a policy's `[resume]` table describes for this command.
/// (Every other layout is a family's: see `frameworks::layout`.)
pub fn custom_layout(cmd: &Command, spec: &CustomSpec) -> Layout {
    let root = spec
        .dir
        .clone()
        .or_else(|| {
            spec.dir_flag
                .as_deref()
                .and_then(|f| cmd.value(&[f]))
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from("."));
    Layout {
        kind: Kind::Custom(spec.clone()),
        root,
        how: ResumeHow::Flag {
            flag: spec.flag.clone(),
            equals: false,
        },
        user_resume: cmd.value(&[spec.flag.as_str()]).map(PathBuf::from),
    }
}

// ---------------------------------------------------------------- completeness

fn is_temporary(name: &str) -> bool {
    name.ends_with(".tmp")
        || name.starts_with("tmp-")
        || name.ends_with(".incomplete")
        || name.ends_with(".partial")
}

/// (total size, newest mtime, file count) of the files up to two levels under `p`.
type Print = (u64, SystemTime, usize);

fn fingerprint(p: &Path) -> Option<Print> {
    let md = fs::metadata(p).ok()?;
    if md.is_file() {
        return Some((md.len(), md.modified().ok()?, 1));
    }
    let mut acc = (0, SystemTime::UNIX_EPOCH, 0);
    let mut stack = vec![(p.to_path_buf(), 0)];
    while let Some((d, depth)) = stack.pop() {
        for e in fs::read_dir(&d).ok()?.flatten() {
            let md = e.metadata().ok()?;
            if md.is_dir() {
                if depth < 2 {
                    stack.push((e.path(), depth + 1));
                }
                continue;
            }
            acc.0 += md.len();
            acc.2 += 1;
            if let Ok(m) = md.modified() {
                acc.1 = acc.1.max(m);
            }
        }
    }
    Some(acc)
}

/// `torch.save` writes a zip whose end-of-central-directory record comes last:
/// a file cut mid-write lacks it.
fn zip_complete(file: &Path) -> Result<(), String> {
    let mut f = fs::File::open(file).map_err(|e| format!("cannot open: {e}"))?;
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len == 0 {
        return Err("is empty".into());
    }
    let tail = len.min(64 * 1024 + 22);
    f.seek(SeekFrom::Start(len - tail))
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::with_capacity(tail as usize);
    f.read_to_end(&mut buf).map_err(|e| e.to_string())?;
    if buf.windows(4).any(|w| w == b"PK\x05\x06") {
        Ok(())
    } else if buf.len() >= 2 && buf[0] == 0x80 {
        // Legacy (non-zip) pickle format: cannot be checked; trust it.
        Ok(())
    } else {
        Err("ends without a zip directory (cut off mid-write?)".into())
    }
}

fn nonempty(p: &Path) -> Result<(), String> {
    match fs::metadata(p) {
        Err(_) => Err(format!(
            "no {}",
            p.file_name().unwrap_or_default().to_string_lossy()
        )),
        Ok(m) if m.len() == 0 => Err(format!(
            "{} is empty",
            p.file_name().unwrap_or_default().to_string_lossy()
        )),
        Ok(_) => Ok(()),
    }
}

fn no_temporaries(dir: &Path) -> Result<(), String> {
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if is_temporary(&name) {
            return Err(format!("holds a temporary file {name}"));
        }
    }
    Ok(())
}

const HF_WEIGHTS: &[&str] = &[
    "model.safetensors",
    "pytorch_model.bin",
    "adapter_model.safetensors",
    "adapter_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
];

/// Why `dir` is not a complete Hugging Face checkpoint, or Ok.
fn hf_complete(dir: &Path) -> Result<(), String> {
    let state = dir.join("trainer_state.json");
    let text =
        fs::read(&state).map_err(|_| "no trainer_state.json (the Trainer writes it last)")?;
    if text.is_empty() {
        return Err("trainer_state.json is empty".into());
    }
    if serde_json::from_slice::<serde_json::Value>(&text).is_err() {
        return Err("trainer_state.json is not valid JSON (cut off mid-write?)".into());
    }
    no_temporaries(dir)?;
    // With DeepSpeed the weights live in the global_stepN folder `latest` names.
    if let Ok(tag) = fs::read_to_string(dir.join("latest")) {
        let sub = dir.join(tag.trim());
        return ds_tag_complete(&sub);
    }
    if !HF_WEIGHTS.iter().any(|w| nonempty(&dir.join(w)).is_ok()) {
        return Err(
            "no model weights (model.safetensors, pytorch_model.bin, adapter_model.*)".into(),
        );
    }
    Ok(())
}

fn ds_tag_complete(sub: &Path) -> Result<(), String> {
    let entries: Vec<_> = fs::read_dir(sub)
        .map_err(|_| format!("`latest` names {} which does not exist", sub.display()))?
        .flatten()
        .collect();
    if entries.is_empty() {
        return Err(format!("{} is empty", sub.display()));
    }
    for e in &entries {
        let name = e.file_name().to_string_lossy().into_owned();
        if is_temporary(&name) {
            return Err(format!("{} holds a temporary file {name}", sub.display()));
        }
        if e.metadata()
            .map(|m| m.is_file() && m.len() == 0)
            .unwrap_or(false)
        {
            return Err(format!("{}/{name} is empty", sub.display()));
        }
    }
    Ok(())
}

fn numbered_dirs(root: &Path, prefix: &str, suffix: &str) -> Vec<Checkpoint> {
    let mut out: Vec<Checkpoint> = fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step = name
                .strip_prefix(prefix)?
                .strip_suffix(suffix)?
                .parse::<u64>()
                .ok()?;
            Some(Checkpoint {
                path: e.path(),
                step,
            })
        })
        .collect();
    out.sort_by_key(|c| std::cmp::Reverse(c.step));
    out
}

/// Every `*.ckpt` under `root` (depth ≤ 5), newest first, `last.ckpt` before its peers.
fn lightning_candidates(root: &Path) -> Vec<Checkpoint> {
    let mut files: Vec<(SystemTime, bool, PathBuf)> = Vec::new();
    let mut stack = vec![(root.to_path_buf(), 0)];
    while let Some((d, depth)) = stack.pop() {
        for e in fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            let Ok(md) = e.metadata() else { continue };
            if md.is_dir() && depth < 5 {
                stack.push((p, depth + 1));
            } else if md.is_file() && p.extension().is_some_and(|x| x == "ckpt") {
                let last = p
                    .file_stem()
                    .is_some_and(|s| s.to_string_lossy().starts_with("last"));
                files.push((md.modified().unwrap_or(SystemTime::UNIX_EPOCH), last, p));
            }
        }
    }
    files.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
    files
        .into_iter()
        .map(|(t, _, p)| Checkpoint {
            step: t
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            path: p,
        })
        .collect()
}

/// Candidates newest first, each with its completeness check.
type Check = Box<dyn Fn(&Path) -> Result<(), String>>;

/// The layout's candidates newest first, their check, and the newer ones
/// already ruled out by the framework's own "latest" marker.
fn candidates(layout: &Layout) -> (Vec<Checkpoint>, Check, Vec<Skipped>) {
    let root = &layout.root;
    match &layout.kind {
        Kind::HuggingFace => (
            numbered_dirs(root, "checkpoint-", ""),
            Box::new(hf_complete),
            Vec::new(),
        ),
        Kind::DeepSpeed => {
            let (c, pre) = deepspeed_candidates(root);
            (c, Box::new(ds_tag_complete), pre)
        }
        Kind::Megatron => {
            let (c, pre) = megatron_candidates(root);
            (c, Box::new(megatron_complete), pre)
        }
        Kind::Lightning => (
            lightning_candidates(root),
            Box::new(zip_complete),
            Vec::new(),
        ),
        Kind::NanoGpt => (nanogpt_candidates(root), Box::new(zip_complete), Vec::new()),
        Kind::Torchtune => {
            let root2 = root.clone();
            let check: Check = Box::new(move |p: &Path| torchtune_complete(&root2, p));
            (torchtune_candidates(root), check, Vec::new())
        }
        Kind::Custom(spec) => {
            let (pre_s, post_s) = spec
                .pattern
                .split_once("{step}")
                .unwrap_or((&spec.pattern, ""));
            let markers = spec.complete_when.clone();
            let check: Check = Box::new(move |p: &Path| custom_complete(&markers, p));
            (numbered_dirs(root, pre_s, post_s), check, Vec::new())
        }
    }
}

/// DeepSpeed's global_stepN folders, newest first, and those newer than the
/// tag `latest` names (not finished).
fn deepspeed_candidates(root: &Path) -> (Vec<Checkpoint>, Vec<Skipped>) {
    let mut pre = Vec::new();
    // `latest` names the newest tag; older global_stepN folders are fallbacks.
    let mut c = numbered_dirs(root, "global_step", "");
    if let Ok(tag) = fs::read_to_string(root.join("latest")) {
        let tag = tag.trim().to_string();
        if let Some(pos) = c
            .iter()
            .position(|x| x.path.file_name().is_some_and(|n| n == tag.as_str()))
        {
            let newer: Vec<Checkpoint> = c.drain(..pos).collect();
            for n in newer {
                pre.push(Skipped {
                    path: n.path,
                    why: format!("newer than `latest` ({tag}): not finished"),
                });
            }
        }
    }
    (c, pre)
}

/// Megatron's iter_N (and global_stepN) folders, newest first, and those newer
/// than latest_checkpointed_iteration.txt (not finished).
fn megatron_candidates(root: &Path) -> (Vec<Checkpoint>, Vec<Skipped>) {
    let mut pre = Vec::new();
    let mut c = numbered_dirs(root, "iter_", "");
    c.extend(numbered_dirs(root, "global_step", ""));
    c.sort_by_key(|c| std::cmp::Reverse(c.step));
    if let Ok(t) = fs::read_to_string(root.join("latest_checkpointed_iteration.txt"))
        && let Ok(it) = t.trim().parse::<u64>()
    {
        let newer: Vec<Checkpoint> = c.iter().filter(|x| x.step > it).cloned().collect();
        c.retain(|x| x.step <= it);
        for n in newer {
            pre.push(Skipped {
                path: n.path,
                why: format!("newer than latest_checkpointed_iteration.txt ({it}): not finished"),
            });
        }
    }
    (c, pre)
}

/// Why a Megatron iteration folder is not complete, or Ok: it holds `.pt`
/// files (loose, or the first of each subfolder), loose ones non-empty, a
/// subfolder's ending with a zip directory, and no temporary names.
fn megatron_complete(p: &Path) -> Result<(), String> {
    let mut any = false;
    for e in fs::read_dir(p).into_iter().flatten().flatten() {
        let sub = e.path();
        if sub.is_dir() {
            if let Some(f) = fs::read_dir(&sub)
                .into_iter()
                .flatten()
                .flatten()
                .find(|f| f.path().extension().is_some_and(|x| x == "pt"))
            {
                zip_complete(&f.path()).map_err(|w| format!("{} {w}", f.path().display()))?;
                any = true;
            }
        } else if sub.extension().is_some_and(|x| x == "pt") {
            nonempty(&sub)?;
            any = true;
        }
    }
    if any {
        no_temporaries(p)
    } else {
        Err("holds no .pt files".into())
    }
}

/// nanoGPT's single `ckpt.pt`, if there is one.
fn nanogpt_candidates(root: &Path) -> Vec<Checkpoint> {
    let ckpt = root.join("ckpt.pt");
    if ckpt.exists() {
        vec![Checkpoint {
            path: ckpt,
            step: 0,
        }]
    } else {
        Vec::new()
    }
}

/// torchtune's epoch_N and step_N folders, newest first.
fn torchtune_candidates(root: &Path) -> Vec<Checkpoint> {
    let mut c = numbered_dirs(root, "epoch_", "");
    c.extend(numbered_dirs(root, "step_", ""));
    c.sort_by_key(|c| std::cmp::Reverse(c.step));
    c
}

/// Why torchtune's folder `p` (under `root`) is not complete, or Ok: a
/// complete recipe_state.pt, no temporaries, and non-empty model weights.
fn torchtune_complete(root: &Path, p: &Path) -> Result<(), String> {
    let rs = [
        root.join("recipe_state").join("recipe_state.pt"),
        root.join("recipe_state.pt"),
        p.join("recipe_state.pt"),
    ];
    let Some(r) = rs.iter().find(|r| r.exists()) else {
        return Err("no recipe_state.pt (the recipe writes it with every checkpoint)".into());
    };
    zip_complete(r).map_err(|w| format!("recipe_state.pt {w}"))?;
    no_temporaries(p)?;
    let has_weights = fs::read_dir(p).into_iter().flatten().flatten().any(|e| {
        let n = e.file_name().to_string_lossy().into_owned();
        (n.ends_with(".safetensors") || n.ends_with(".pt") || n.ends_with(".bin"))
            && e.metadata().map(|m| m.len() > 0).unwrap_or(false)
    });
    if has_weights {
        Ok(())
    } else {
        Err("no model weights".into())
    }
}

/// Why a folder is not complete by a policy's `complete_when` markers, or Ok.
fn custom_complete(markers: &[String], p: &Path) -> Result<(), String> {
    for m in markers {
        nonempty(&p.join(m))?;
    }
    no_temporaries(p)
}

/// The newest complete checkpoint. `settle` is how long to watch a candidate
/// for changes (zero in `plan`; a short interval between attempts).
pub fn find(layout: &Layout, settle: Duration) -> Found {
    let (cands, check, mut skipped) = candidates(layout);
    let mut latest = None;
    for c in cands {
        if let Err(why) = check(&c.path) {
            skipped.push(Skipped { path: c.path, why });
            continue;
        }
        if !settle.is_zero() {
            let before = fingerprint(&c.path);
            std::thread::sleep(settle);
            if fingerprint(&c.path) != before {
                skipped.push(Skipped {
                    path: c.path,
                    why: "still being written (files changed while oomguard watched)".into(),
                });
                continue;
            }
        }
        latest = Some(c);
        break;
    }
    Found {
        layout: layout.name().to_string(),
        latest,
        skipped,
    }
}

/// The step number in a resume path (`.../checkpoint-N`, `global_stepN`, `step_N`, `iter_000N`).
pub fn step_of(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    let digits: String = name
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_digit())
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    digits.parse().ok()
}

/// The global step recorded in a Hugging Face checkpoint's `trainer_state.json`.
pub fn recorded_step(ckpt: &Path) -> Option<u64> {
    let text = fs::read(ckpt.join("trainer_state.json")).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    v.get("global_step")?.as_u64()
}

/// The step a checkpoint stands for: recorded in it, else its number.
pub fn step_for(c: &Checkpoint) -> Option<u64> {
    recorded_step(&c.path).or_else(|| (c.step > 0 && c.step < 1 << 40).then_some(c.step))
}

/// When a checkpoint was written (its newest file).
pub fn written_at(p: &Path) -> Option<SystemTime> {
    fingerprint(p).map(|f| f.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Command {
        let a: Vec<std::ffi::OsString> = s.split_whitespace().map(Into::into).collect();
        Command::parse(&a)
    }

    fn hf_ckpt(root: &Path, n: u64, state: Option<&str>) {
        let d = root.join(format!("checkpoint-{n}"));
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("model.safetensors"), b"weights").unwrap();
        if let Some(s) = state {
            fs::write(d.join("trainer_state.json"), s).unwrap();
        }
    }

    /// The layout a run would use: the policy's table, else the families'.
    fn detect(cmd: &Command, custom: Option<&CustomSpec>, out: Option<&str>) -> Option<Layout> {
        if let Some(spec) = custom {
            return Some(custom_layout(cmd, spec));
        }
        let ctx = crate::frameworks::Ctx {
            recipe_output_dir: out,
            recipe_value: &|_| None,
        };
        crate::frameworks::layout(cmd, &ctx)
    }

    fn layout_for(cmd: &str) -> Layout {
        detect(&argv(cmd), None, None).expect("a layout")
    }

    #[test]
    fn recipe_yaml_output_dir_and_each_tools_resume_spelling() {
        let l = detect(
            &argv("axolotl train cfg.yml"),
            None,
            Some("./outputs/lora-out"),
        )
        .unwrap();
        assert_eq!(l.root, PathBuf::from("./outputs/lora-out"));
        assert_eq!(
            l.how,
            ResumeHow::Flag {
                flag: "--resume-from-checkpoint".into(),
                equals: false
            }
        );
        let l = detect(
            &argv("llamafactory-cli train x.yaml"),
            None,
            Some("saves/x"),
        )
        .unwrap();
        assert!(
            matches!(l.how, ResumeHow::Override { ref key, value: None } if key == "resume_from_checkpoint")
        );
        // A flag on the command line wins over the recipe.
        let l = detect(
            &argv("python sft.py --config r.yaml --output_dir o"),
            None,
            Some("x"),
        )
        .unwrap();
        assert_eq!(l.root, PathBuf::from("o"));
    }

    /// A tiny valid zip, as torch.save writes (only the end record matters here).
    fn zip_bytes() -> Vec<u8> {
        let mut v = b"PK\x03\x04fake-entry".to_vec();
        v.extend_from_slice(b"PK\x05\x06\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0");
        v
    }

    #[test]
    fn hf_newest_complete_wins_and_skips_are_explained() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        hf_ckpt(&out, 5, Some(r#"{"global_step": 5}"#));
        hf_ckpt(&out, 10, Some(r#"{"global_step": 10}"#));
        hf_ckpt(&out, 15, None); // killed before trainer_state.json
        hf_ckpt(&out, 20, Some(r#"{"global_st"#)); // cut mid-write
        fs::create_dir_all(out.join("checkpoint-x")).unwrap();
        let l = layout_for(&format!("python t.py --output_dir {}", out.display()));
        assert_eq!(l.kind, Kind::HuggingFace);
        let f = find(&l, Duration::ZERO);
        let latest = f.latest.unwrap();
        assert_eq!(latest.step, 10);
        assert_eq!(step_for(&latest), Some(10));
        let skipped: Vec<_> = f
            .skipped
            .iter()
            .map(|s| s.path.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(skipped, ["checkpoint-20", "checkpoint-15"]);
        assert!(f.skipped[0].why.contains("not valid JSON"));
    }

    #[test]
    fn hf_needs_weights_and_no_temporaries() {
        let t = tempfile::tempdir().unwrap();
        hf_ckpt(t.path(), 5, Some("{}"));
        hf_ckpt(t.path(), 6, Some("{}"));
        hf_ckpt(t.path(), 7, Some("{}"));
        fs::write(t.path().join("checkpoint-6/optimizer.pt.tmp"), b"x").unwrap();
        fs::remove_file(t.path().join("checkpoint-7/model.safetensors")).unwrap();
        let l = layout_for(&format!("python t.py --output_dir={}", t.path().display()));
        let f = find(&l, Duration::ZERO);
        assert_eq!(f.latest.unwrap().step, 5);
        assert!(
            f.skipped[0].why.contains("no model weights"),
            "{:?}",
            f.skipped
        );
        assert!(f.skipped[1].why.contains("temporary"), "{:?}", f.skipped);
    }

    #[test]
    fn hf_with_deepspeed_checks_the_tag_folder() {
        let t = tempfile::tempdir().unwrap();
        for n in [10, 20] {
            let d = t.path().join(format!("checkpoint-{n}"));
            fs::create_dir_all(d.join(format!("global_step{n}"))).unwrap();
            fs::write(d.join("trainer_state.json"), "{}").unwrap();
            fs::write(d.join("latest"), format!("global_step{n}")).unwrap();
        }
        fs::write(
            t.path()
                .join("checkpoint-10/global_step10/mp_rank_00_model_states.pt"),
            b"x",
        )
        .unwrap();
        // checkpoint-20's global_step20 is still empty: the save died.
        let l = layout_for(&format!(
            "deepspeed t.py --output_dir {}",
            t.path().display()
        ));
        let f = find(&l, Duration::ZERO);
        assert_eq!(f.latest.unwrap().step, 10);
        assert!(f.skipped[0].why.contains("is empty"), "{:?}", f.skipped);
    }

    #[test]
    fn megatron_follows_the_tracker_file() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        for it in [500u64, 1000, 1500] {
            let d = root.join(format!("iter_{it:07}/mp_rank_00"));
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("model_optim_rng.pt"), zip_bytes()).unwrap();
        }
        fs::write(root.join("latest_checkpointed_iteration.txt"), "1000\n").unwrap();
        // iter 1000's file was cut: fall back to 500.
        fs::write(
            root.join("iter_0001000/mp_rank_00/model_optim_rng.pt"),
            b"PK\x03\x04cut",
        )
        .unwrap();
        let cmd = format!(
            "torchrun pretrain_gpt.py --save {0} --load {0} --micro-batch-size 4",
            root.display()
        );
        let l = layout_for(&cmd);
        assert_eq!(l.kind, Kind::Megatron);
        assert_eq!(l.how, ResumeHow::Automatic);
        let f = find(&l, Duration::ZERO);
        assert_eq!(f.latest.unwrap().step, 500);
        assert!(
            f.skipped
                .iter()
                .any(|s| s.why.contains("latest_checkpointed_iteration.txt (1000)"))
        );
        assert!(f.skipped.iter().any(|s| s.why.contains("zip directory")));
    }

    #[test]
    fn deepspeed_engine_latest_tag() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        for n in [100, 200, 300] {
            let d = root.join(format!("global_step{n}"));
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("mp_rank_00_model_states.pt"), b"x").unwrap();
        }
        fs::write(root.join("latest"), "global_step200").unwrap();
        let cmd = format!(
            "deepspeed pretrain.py --deepspeed --save {} ",
            root.display()
        );
        let l = layout_for(&cmd);
        assert_eq!(l.kind, Kind::DeepSpeed);
        let f = find(&l, Duration::ZERO);
        assert_eq!(f.latest.unwrap().step, 200);
        assert!(f.skipped[0].why.contains("newer than `latest`"));
    }

    #[test]
    fn lightning_prefers_the_newest_complete_ckpt() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("lightning_logs/version_0/checkpoints");
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("epoch=0-step=100.ckpt"), zip_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        fs::write(d.join("last.ckpt"), b"PK\x03\x04 cut off").unwrap();
        let cmd = format!(
            "python cli.py fit --trainer.default_root_dir={}/lightning_logs",
            t.path().display()
        );
        let l = layout_for(&cmd);
        assert_eq!(l.kind, Kind::Lightning);
        let f = find(&l, Duration::ZERO);
        assert!(f.latest.unwrap().path.ends_with("epoch=0-step=100.ckpt"));
        assert!(f.skipped[0].path.ends_with("last.ckpt"));
    }

    #[test]
    fn nanogpt_reads_out_dir_from_its_config_module() {
        let t = tempfile::tempdir().unwrap();
        let cfg = t.path().join("config/train_x.py");
        fs::create_dir_all(cfg.parent().unwrap()).unwrap();
        let out = t.path().join("out-x");
        fs::write(
            &cfg,
            format!("batch_size = 12\nout_dir = '{}'\n", out.display()),
        )
        .unwrap();
        fs::create_dir_all(&out).unwrap();
        fs::write(out.join("ckpt.pt"), zip_bytes()).unwrap();
        let cmd = format!("python train.py {} --batch_size=12", cfg.display());
        let l = layout_for(&cmd);
        assert_eq!(l.kind, Kind::NanoGpt);
        assert_eq!(l.root, out);
        assert!(find(&l, Duration::ZERO).latest.is_some());
        fs::write(out.join("ckpt.pt"), b"PK\x03\x04half").unwrap();
        assert!(find(&l, Duration::ZERO).latest.is_none());
    }

    #[test]
    fn torchtune_needs_recipe_state() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path();
        for n in [0, 1] {
            let d = out.join(format!("epoch_{n}"));
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("model-00001-of-00001.safetensors"), b"w").unwrap();
        }
        let cmd = format!(
            "tune run lora_finetune_single_device --config x batch_size=8 output_dir={}",
            out.display()
        );
        let l = layout_for(&cmd);
        assert_eq!(l.kind, Kind::Torchtune);
        assert!(find(&l, Duration::ZERO).latest.is_none());
        fs::create_dir_all(out.join("recipe_state")).unwrap();
        fs::write(out.join("recipe_state/recipe_state.pt"), zip_bytes()).unwrap();
        assert_eq!(find(&l, Duration::ZERO).latest.unwrap().step, 1);
    }

    #[test]
    fn custom_layout_from_a_policy_table() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("outputs/gsa-512m");
        for n in [4000, 5000, 6000] {
            let d = root.join(format!("step_{n}"));
            fs::create_dir_all(&d).unwrap();
            fs::write(d.join("model.safetensors"), b"w").unwrap();
            if n != 6000 {
                fs::write(d.join("optimizer.pt"), b"o").unwrap();
            }
        }
        let spec = CustomSpec {
            flag: "--resume_from".into(),
            dir: Some(root.clone()),
            dir_flag: None,
            pattern: "step_{step}".into(),
            complete_when: vec!["model.safetensors".into(), "optimizer.pt".into()],
            label: None,
        };
        let l = detect(&argv("python train.py --lr 1e-4"), Some(&spec), None).unwrap();
        let f = find(&l, Duration::ZERO);
        assert_eq!(f.latest.unwrap().step, 5000);
        assert_eq!(f.skipped[0].why, "no optimizer.pt");
    }

    #[test]
    fn still_being_written_is_skipped() {
        let t = tempfile::tempdir().unwrap();
        hf_ckpt(t.path(), 5, Some("{}"));
        hf_ckpt(t.path(), 10, Some("{}"));
        let l = layout_for(&format!("python t.py --output_dir {}", t.path().display()));
        let writer_path = t.path().join("checkpoint-10/optimizer.pt");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s2 = stop.clone();
        let h = std::thread::spawn(move || {
            let mut n = 0u64;
            while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                fs::write(&writer_path, vec![0u8; (n % 50 + 1) as usize * 1024]).unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let f = find(&l, Duration::from_millis(150));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        h.join().unwrap();
        assert_eq!(f.latest.unwrap().step, 5);
        assert!(f.skipped[0].why.contains("still being written"));
    }

    #[test]
    fn no_folder_means_no_checkpoint() {
        let l = layout_for("python t.py --output_dir /nonexistent/oomguard");
        let f = find(&l, Duration::ZERO);
        assert!(f.latest.is_none() && f.skipped.is_empty());
    }

    #[test]
    fn step_numbers_from_paths() {
        assert_eq!(step_of(Path::new("o/checkpoint-500")), Some(500));
        assert_eq!(step_of(Path::new("o/iter_0001000")), Some(1000));
        assert_eq!(step_of(Path::new("o/last.ckpt")), None);
    }
}
