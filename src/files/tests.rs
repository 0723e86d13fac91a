use std::path::{Path, PathBuf};

use super::*;

/// A unified diff from `d`'s original to its current text, labelled with the file name;
/// empty when unchanged.
fn diff_of(d: &Doc, new_label: &str) -> String {
    unified_diff(
        &d.path.display().to_string(),
        new_label,
        &d.original,
        &d.text,
    )
}

fn own(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/configs")
        .join(name)
}

fn load(name: &str) -> Doc {
    Doc::load(&own(name)).unwrap_or_else(|e| panic!("{e}"))
}

/// Lines removed and added by a unified diff (headers excluded).
fn changes(diff: &str) -> (Vec<String>, Vec<String>) {
    let mut minus = Vec::new();
    let mut plus = Vec::new();
    for l in diff.lines() {
        if l.starts_with("---") || l.starts_with("+++") {
            continue;
        }
        if let Some(r) = l.strip_prefix('-') {
            minus.push(r.to_string());
        } else if let Some(r) = l.strip_prefix('+') {
            plus.push(r.to_string());
        }
    }
    (minus, plus)
}

/// A different value of the same spirit (a type change for "auto" and null).
fn other(v: &Scalar) -> Scalar {
    match v {
        Scalar::Int(i) if *i > 2 => Scalar::Int(i / 2),
        Scalar::Int(i) => Scalar::Int(i + 1),
        Scalar::Float(x) => Scalar::Float(x * 2.0 + 0.5),
        Scalar::Bool(b) => Scalar::Bool(!b),
        Scalar::Str(s) if s == "auto" => Scalar::Int(4),
        Scalar::Str(s) if s == "cpu" => Scalar::Str("none".into()),
        Scalar::Str(_) => Scalar::Str("cpu".into()),
        Scalar::Null => Scalar::Int(512),
    }
}

/// Set `key` to a different value: re-parses, reads back, the diff is one
/// `-` and one `+` line, and setting it back restores the text byte for byte.
fn round_trip(path: &Path, key: &str) -> Result<(), String> {
    let doc = Doc::load(path).map_err(|e| e.to_string())?;
    let old = doc
        .get(key)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{key} absent"))?;
    let new = other(&old);
    let mut d = doc.clone();
    d.set(key, &new).map_err(|e| e.to_string())?;
    if !d.changed() {
        return Err(format!("{key}: set {new} changed nothing"));
    }
    let re = Doc::parse(path, d.text().to_string()).map_err(|e| format!("re-parse: {e}"))?;
    let got = re.get(key).map_err(|e| e.to_string())?;
    if got.as_ref() != Some(&new) {
        return Err(format!("{key}: wrote {new}, read back {got:?}"));
    }
    let diff = unified_diff("a", "b", doc.text(), d.text());
    let (m, p) = changes(&diff);
    if m.len() != 1 || p.len() != 1 {
        return Err(format!("{key}: diff is not one line for one:\n{diff}"));
    }
    d.set(key, &old).map_err(|e| format!("setting back: {e}"))?;
    if d.text() != doc.text() {
        return Err(format!(
            "{key}: setting {old} back did not restore the text:\n{}",
            unified_diff("orig", "back", doc.text(), d.text())
        ));
    }
    if d.changed() {
        return Err("changed() after restoring".into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Own fixtures

#[test]
fn formats_by_extension_and_sniffing() {
    assert_eq!(format_of(Path::new("a/ds.json")), Some(Format::Json));
    assert_eq!(format_of(Path::new("x.YML")), Some(Format::Yaml));
    assert_eq!(format_of(Path::new("x.yaml")), Some(Format::Yaml));
    assert_eq!(format_of(Path::new("x.toml")), Some(Format::Toml));
    assert_eq!(
        format_of(Path::new("config/train_gpt2.py")),
        Some(Format::Python)
    );
    assert_eq!(format_of(Path::new("stage3.conf")), None);
    let d = load("ds_stage2.conf");
    assert_eq!(d.format(), Format::Json);
    assert_eq!(
        d.get("zero_optimization.stage").unwrap(),
        Some(Scalar::Int(2))
    );
    let e = Doc::parse(Path::new("notes.txt"), "hello".into()).unwrap_err();
    assert!(e.to_string().contains("unknown config format"), "{e}");
}

#[test]
fn json_get_values() {
    let d = load("ds_zero2_offload.json");
    assert_eq!(
        d.get("zero_optimization.stage").unwrap(),
        Some(Scalar::Int(2))
    );
    assert_eq!(
        d.get("zero_optimization.offload_optimizer.device").unwrap(),
        Some(Scalar::Str("cpu".into()))
    );
    assert_eq!(
        d.get("train_micro_batch_size_per_gpu").unwrap(),
        Some(Scalar::Str("auto".into()))
    );
    assert_eq!(
        d.get("zero_optimization.reduce_bucket_size").unwrap(),
        Some(Scalar::Float(5e8))
    );
    assert_eq!(
        d.get("wall_clock_breakdown").unwrap(),
        Some(Scalar::Bool(false))
    );
    assert_eq!(
        d.get("zero_optimization.offload_param.device").unwrap(),
        None
    );
    assert_eq!(d.get("nothing.here").unwrap(), None);
    assert!(matches!(
        d.get("zero_optimization"),
        Err(FileError::NotScalar { .. })
    ));
    assert!(matches!(
        d.get("train_batch_size.x"),
        Err(FileError::Unsupported { .. })
    ));
    let e = d.require("zero_optimization.offload_param").unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, FileError::NoKey { .. }));
    assert!(
        msg.contains("has no key zero_optimization.offload_param"),
        "{msg}"
    );
    assert!(
        msg.contains("the keys at zero_optimization are: stage, offload_optimizer"),
        "{msg}"
    );
}

#[test]
fn json_set_keeps_everything_else() {
    let p = own("ds_zero2_offload.json");
    for key in [
        "zero_optimization.stage",
        "zero_optimization.offload_optimizer.device",
        "zero_optimization.offload_optimizer.pin_memory",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "zero_optimization.reduce_bucket_size",
    ] {
        round_trip(&p, key).unwrap();
    }
    let mut d = load("ds_zero2_offload.json");
    d.set("train_micro_batch_size_per_gpu", &Scalar::Int(4))
        .unwrap();
    assert!(
        d.text()
            .contains("    \"train_micro_batch_size_per_gpu\": 4,\n")
    );
    d.set("zero_optimization.stage", &Scalar::Int(3)).unwrap();
    let (m, p) = changes(&diff_of(&d, "copy"));
    assert_eq!((m.len(), p.len()), (2, 2), "{}", diff_of(&d, "copy"));
}

#[test]
fn json_insert_creates_parents_adding_lines_only() {
    let mut d = load("ds_zero3_plain.json");
    d.set(
        "zero_optimization.offload_optimizer.device",
        &Scalar::Str("cpu".into()),
    )
    .unwrap();
    d.set(
        "zero_optimization.offload_param.device",
        &Scalar::Str("cpu".into()),
    )
    .unwrap();
    let diff = diff_of(&d, "copy");
    let (m, p) = changes(&diff);
    assert!(m.is_empty(), "{diff}");
    assert_eq!(
        p,
        vec![
            "    \"offload_optimizer\": {",
            "      \"device\": \"cpu\"",
            "    },",
            "    \"offload_param\": {",
            "      \"device\": \"cpu\"",
            "    },",
        ],
        "{diff}"
    );
    let re = Doc::parse(d.path(), d.text().to_string()).unwrap();
    assert_eq!(
        re.get("zero_optimization.offload_param.device").unwrap(),
        Some(Scalar::Str("cpu".into()))
    );
    // A single-line object gets the member inline; an empty one too.
    let mut d = load("ds_zero3_plain.json");
    d.set("fp16.loss_scale", &Scalar::Int(0)).unwrap();
    assert!(
        d.text()
            .contains(r#""fp16": {"enabled": false, "loss_scale": 0}"#),
        "{}",
        d.text()
    );
    let mut e = Doc::parse(Path::new("e.json"), "{\"a\": {}}\n".into()).unwrap();
    e.set("a.b.c", &Scalar::Int(1)).unwrap();
    assert_eq!(e.text(), "{\"a\": {\"b\": {\"c\": 1}}}\n");
    // A new top-level key goes in as its own line.
    let mut d = load("ds_zero3_plain.json");
    d.set("gradient_clipping", &Scalar::Float(1.0)).unwrap();
    let (m, p) = changes(&diff_of(&d, "copy"));
    assert!(m.is_empty());
    assert_eq!(p, vec!["  \"gradient_clipping\": 1.0,"]);
}

#[test]
fn json_lenient_comments_and_trailing_commas() {
    let text = "{\n  // the stage\n  \"zero_optimization\": {\"stage\": 2, /* two */},\n  \"x\": [1, 2,],\n}\n";
    let mut d = Doc::parse(Path::new("c.json"), text.into()).unwrap();
    assert_eq!(
        d.get("zero_optimization.stage").unwrap(),
        Some(Scalar::Int(2))
    );
    d.set("zero_optimization.stage", &Scalar::Int(3)).unwrap();
    assert_eq!(d.text(), text.replace("\"stage\": 2", "\"stage\": 3"));
    // Trailing-comma style: the new member goes last, with its own comma.
    d.set("y", &Scalar::Bool(true)).unwrap();
    assert!(
        d.text().ends_with("  \"x\": [1, 2,],\n  \"y\": true,\n}\n"),
        "{}",
        d.text()
    );
}

#[test]
fn json_template_is_a_clear_parse_error() {
    let e = Doc::load(&own("ds_template_broken.json")).unwrap_err();
    let FileError::Parse {
        line, ref message, ..
    } = e
    else {
        panic!("{e:?}")
    };
    assert_eq!(line, 2);
    let msg = e.to_string();
    assert!(msg.contains("ds_template_broken.json:2:"), "{msg}");
    assert!(message.contains("column 24"), "{msg}");
    assert!(message.contains("expected a value"), "{msg}");
    assert!(message.contains("'G'"), "{msg}");
}

#[test]
fn yaml_get_values() {
    let d = load("accelerate_zero3.yaml");
    assert_eq!(
        d.get("deepspeed_config.zero_stage").unwrap(),
        Some(Scalar::Int(3))
    );
    assert_eq!(
        d.get("deepspeed_config.offload_optimizer_device").unwrap(),
        Some(Scalar::Str("none".into()))
    );
    assert_eq!(
        d.get("downcast_bf16").unwrap(),
        Some(Scalar::Str("no".into()))
    );
    assert_eq!(d.get("debug").unwrap(), Some(Scalar::Bool(false)));
    assert!(matches!(d.get("tpu_env"), Err(FileError::NotScalar { .. })));
    let a = load("axolotl_lora.yml");
    assert_eq!(a.get("micro_batch_size").unwrap(), Some(Scalar::Int(2)));
    assert_eq!(a.get("learning_rate").unwrap(), Some(Scalar::Float(0.0002)));
    assert_eq!(
        a.get("lr_scheduler").unwrap(),
        Some(Scalar::Str("cosine".into()))
    );
    assert_eq!(a.get("deepspeed").unwrap(), Some(Scalar::Null));
    assert_eq!(a.get("deepspeed.zero_stage").unwrap(), None);
    assert_eq!(
        a.get("fsdp_config.offload_params").unwrap(),
        Some(Scalar::Bool(false))
    );
    assert_eq!(a.get("gradient_checkpointing").unwrap(), None);
    let t = load("torchtune_full.yaml");
    assert_eq!(t.get("tokenizer.max_seq_len").unwrap(), Some(Scalar::Null));
    assert_eq!(t.get("optimizer.lr").unwrap(), Some(Scalar::Float(2e-5)));
    assert_eq!(
        t.get("checkpointer.output_dir").unwrap(),
        Some(Scalar::Str("${output_dir}".into()))
    );
}

#[test]
fn yaml_set_keeps_comments_quotes_and_case() {
    for key in [
        "deepspeed_config.zero_stage",
        "deepspeed_config.offload_optimizer_device",
        "deepspeed_config.offload_param_device",
        "downcast_bf16",
        "num_processes",
    ] {
        round_trip(&own("accelerate_zero3.yaml"), key).unwrap();
    }
    for key in [
        "micro_batch_size",
        "gradient_accumulation_steps",
        "sequence_len",
        "lr_scheduler",
        "fsdp_config.offload_params",
        "learning_rate",
    ] {
        round_trip(&own("axolotl_lora.yml"), key).unwrap();
    }
    for key in [
        "batch_size",
        "tokenizer.max_seq_len",
        "enable_activation_checkpointing",
        "gradient_accumulation_steps",
        "optimizer_in_bwd",
    ] {
        round_trip(&own("torchtune_full.yaml"), key).unwrap();
    }
    let mut a = load("axolotl_lora.yml");
    a.set("micro_batch_size", &Scalar::Int(1)).unwrap();
    assert!(a.text().contains("\nmicro_batch_size: 1  # per GPU\n"));
    let mut d = load("accelerate_zero3.yaml");
    d.set("downcast_bf16", &Scalar::Str("bf16".into())).unwrap();
    assert!(d.text().contains("\ndowncast_bf16: 'bf16'\n"));
    d.set(
        "deepspeed_config.offload_param_device",
        &Scalar::Str("cpu".into()),
    )
    .unwrap();
    assert!(d.text().contains("\n  offload_param_device: cpu\n"));
    // A string that would read as a boolean is quoted.
    d.set(
        "deepspeed_config.offload_optimizer_device",
        &Scalar::Str("yes".into()),
    )
    .unwrap();
    assert!(
        d.text().contains("\n  offload_optimizer_device: 'yes'\n"),
        "{}",
        d.text()
    );
    let mut t = load("torchtune_full.yaml");
    t.set("enable_activation_checkpointing", &Scalar::Bool(true))
        .unwrap();
    assert!(
        t.text()
            .contains("\nenable_activation_checkpointing: True\n")
    );
    t.set("optimizer.lr", &Scalar::Float(1e-5)).unwrap();
    assert!(t.text().contains("\n  lr: 1.0e-5\n"), "{}", t.text());
}

#[test]
fn yaml_insert_adds_lines_only() {
    let mut a = load("axolotl_lora.yml");
    a.set("gradient_checkpointing", &Scalar::Bool(true))
        .unwrap();
    let (m, p) = changes(&diff_of(&a, "copy"));
    assert!(m.is_empty());
    assert_eq!(p, vec!["gradient_checkpointing: true"]);
    // A child of an existing block mapping, at its indentation.
    a.set("fsdp_config.offload_optimizer", &Scalar::Bool(true))
        .unwrap();
    assert!(
        a.text()
            .contains("fsdp_config:\n  offload_params: False\n  offload_optimizer: true\n"),
        "{}",
        a.text()
    );
    // Missing parents are created, one indentation step per level.
    let mut d = load("accelerate_zero3.yaml");
    d.set("fsdp_config.fsdp_offload.params", &Scalar::Bool(true))
        .unwrap();
    let (m, p) = changes(&diff_of(&d, "copy"));
    assert!(m.is_empty());
    assert_eq!(
        p,
        vec!["fsdp_config:", "  fsdp_offload:", "    params: true"]
    );
    // Under an empty `key:` (null), below the key line.
    let mut a = load("axolotl_lora.yml");
    a.set("deepspeed.zero_optimization.stage", &Scalar::Int(2))
        .unwrap();
    let (m, p) = changes(&diff_of(&a, "copy"));
    assert!(m.is_empty());
    assert_eq!(p, vec!["  zero_optimization:", "    stage: 2"]);
    let re = Doc::parse(a.path(), a.text().into()).unwrap();
    assert_eq!(
        re.get("deepspeed.zero_optimization.stage").unwrap(),
        Some(Scalar::Int(2))
    );
    // Nested child after a nested mapping that ends with a multi-line flow list.
    let mut t = load("torchtune_full.yaml");
    t.set("checkpointer.recipe_checkpoint", &Scalar::Null)
        .unwrap();
    let (m, p) = changes(&diff_of(&t, "copy"));
    assert!(m.is_empty());
    assert_eq!(p, vec!["  recipe_checkpoint: null"]);
}

#[test]
fn yaml_flow_mapping_neox() {
    let d = load("neox_small.yml");
    assert_eq!(
        d.get("zero_optimization.stage").unwrap(),
        Some(Scalar::Int(1))
    );
    assert_eq!(
        d.get("zero_optimization.overlap_comm").unwrap(),
        Some(Scalar::Bool(true))
    );
    assert_eq!(
        d.get("train_micro_batch_size_per_gpu").unwrap(),
        Some(Scalar::Int(8))
    );
    for key in [
        "zero_optimization.stage",
        "train_micro_batch_size_per_gpu",
        "checkpoint_activations",
        "hostfile",
        "seq_length",
    ] {
        round_trip(&own("neox_small.yml"), key).unwrap();
    }
    let mut d = load("neox_small.yml");
    d.set(
        "zero_optimization.offload_optimizer.device",
        &Scalar::Str("cpu".into()),
    )
    .unwrap();
    let diff = diff_of(&d, "copy");
    let (m, p) = changes(&diff);
    assert!(m.is_empty(), "{diff}");
    assert_eq!(
        p,
        vec![
            "    \"offload_optimizer\": {",
            "     \"device\": \"cpu\"",
            "    },"
        ],
        "{diff}"
    );
    let re = Doc::parse(d.path(), d.text().into()).unwrap();
    assert_eq!(
        re.get("zero_optimization.offload_optimizer.device")
            .unwrap(),
        Some(Scalar::Str("cpu".into()))
    );
}

#[test]
fn yaml_unsupported_cases_say_why() {
    let text = "base: &b 4\nother: *b\nblock: |\n  text\nm: {a: 1}\n";
    let mut d = Doc::parse(Path::new("x.yaml"), text.into()).unwrap();
    assert_eq!(d.get("other").unwrap(), Some(Scalar::Int(4)));
    assert_eq!(d.get("m.a").unwrap(), Some(Scalar::Int(1)));
    for (key, why) in [
        ("base", "anchor"),
        ("other", "alias"),
        ("block", "block scalar"),
    ] {
        let e = d.set(key, &Scalar::Int(1)).unwrap_err();
        assert!(e.to_string().contains(why), "{e}");
    }
    d.set("m.a", &Scalar::Int(2)).unwrap();
    d.set("m.b", &Scalar::Str("x y".into())).unwrap();
    assert!(d.text().ends_with("m: {a: 2, b: x y}\n"), "{}", d.text());
    let e = Doc::parse(Path::new("x.yaml"), "a: 1\n---\nb: 2\n".into()).unwrap_err();
    assert!(e.to_string().contains("several YAML documents"), "{e}");
    let e = Doc::parse(Path::new("bad.yaml"), "a: 1\nb: [1, 2\nc: 3\n".into()).unwrap_err();
    assert!(matches!(e, FileError::Parse { .. }), "{e}");
    assert!(e.to_string().starts_with("bad.yaml:"), "{e}");
}

#[test]
fn toml_get_set_insert() {
    let p = own("titan_small.toml");
    let d = load("titan_small.toml");
    assert_eq!(
        d.get("training.local_batch_size").unwrap(),
        Some(Scalar::Int(8))
    );
    assert_eq!(
        d.get("training.max_norm").unwrap(),
        Some(Scalar::Float(1.0))
    );
    assert_eq!(
        d.get("parallelism.data_parallel_shard_degree").unwrap(),
        Some(Scalar::Int(-1))
    );
    assert_eq!(
        d.get("activation_checkpoint.mode").unwrap(),
        Some(Scalar::Str("none".into()))
    );
    assert_eq!(
        d.get("quantize.linear.float8.enable_fsdp_float8_all_gather")
            .unwrap(),
        Some(Scalar::Bool(false))
    );
    for key in [
        "training.local_batch_size",
        "training.seq_len",
        "training.max_norm",
        "activation_checkpoint.mode",
        "job.description",
        "parallelism.data_parallel_shard_degree",
    ] {
        round_trip(&p, key).unwrap();
    }
    let mut d = load("titan_small.toml");
    d.set("job.description", &Scalar::Str("other".into()))
        .unwrap();
    assert!(d.text().contains("\ndescription = 'other'\n"));
    d.set("activation_checkpoint.mode", &Scalar::Str("full".into()))
        .unwrap();
    assert!(
        d.text()
            .contains("\nmode = \"full\"  # [\"none\", \"selective\", \"full\"]\n")
    );
    // Insert into an existing table, a new table, and an implicit one.
    let mut d = load("titan_small.toml");
    d.set("training.gc_freq", &Scalar::Int(50)).unwrap();
    d.set("compile.enable", &Scalar::Bool(true)).unwrap();
    d.set("quantize.mode", &Scalar::Str("fp8".into())).unwrap();
    let diff = diff_of(&d, "copy");
    let (m, p) = changes(&diff);
    assert!(m.is_empty(), "{diff}");
    for want in ["gc_freq = 50", "[compile]", "[quantize]"] {
        assert!(p.iter().any(|l| l == want), "{diff}");
    }
    assert!(
        d.text().contains("steps = 10\ngc_freq = 50\n"),
        "{}",
        d.text()
    );
    let re = Doc::parse(d.path(), d.text().into()).unwrap();
    assert_eq!(re.get("compile.enable").unwrap(), Some(Scalar::Bool(true)));
    assert_eq!(
        re.get("quantize.mode").unwrap(),
        Some(Scalar::Str("fp8".into()))
    );
    let e = load("titan_small.toml")
        .set("training.seq_len", &Scalar::Null)
        .unwrap_err();
    assert!(e.to_string().contains("no null"), "{e}");
    let e = Doc::parse(Path::new("bad.toml"), "[a]\nx = \n".into()).unwrap_err();
    assert!(matches!(e, FileError::Parse { line: 2, .. }), "{e}");
}

#[test]
fn python_config_module() {
    let p = own("nanogpt_config.py");
    let d = load("nanogpt_config.py");
    assert_eq!(d.get("batch_size").unwrap(), Some(Scalar::Int(8)));
    assert_eq!(d.get("wandb_log").unwrap(), Some(Scalar::Bool(false)));
    assert_eq!(
        d.get("out_dir").unwrap(),
        Some(Scalar::Str("out-small".into()))
    );
    assert_eq!(d.get("learning_rate").unwrap(), Some(Scalar::Float(6e-4)));
    assert_eq!(
        d.get("per_device_train_batch_size").unwrap(),
        Some(Scalar::Int(2))
    );
    assert_eq!(
        d.get("training_args.max_seq_length").unwrap(),
        Some(Scalar::Int(1024))
    );
    assert_eq!(d.get("batch_size_eval").unwrap(), Some(Scalar::Int(16)));
    // `4 * 2` is constant arithmetic: read as 8, replaced whole when changed.
    assert_eq!(
        d.get("gradient_accumulation_steps").unwrap(),
        Some(Scalar::Int(8))
    );
    let mut d2 = load("nanogpt_config.py");
    d2.set("gradient_accumulation_steps", &Scalar::Int(16))
        .unwrap();
    assert!(
        d2.text().contains("\ngradient_accumulation_steps = 16\n"),
        "{}",
        d2.text()
    );
    for key in [
        "batch_size",
        "block_size",
        "wandb_log",
        "wandb_project",
        "out_dir",
        "learning_rate",
        "per_device_train_batch_size",
        "gradient_checkpointing",
        "max_seq_length",
        "compile",
    ] {
        round_trip(&p, key).unwrap();
    }
    let mut d = load("nanogpt_config.py");
    d.set("wandb_project", &Scalar::Str("it's".into())).unwrap();
    assert!(d.text().contains("\nwandb_project = 'it\\'s'\n"));
    d.set("gradient_checkpointing", &Scalar::Bool(true))
        .unwrap();
    assert!(
        d.text()
            .contains("\n    \"gradient_checkpointing\": True,\n")
    );
    d.set("max_iters", &Scalar::Int(100)).unwrap();
    assert!(d.text().ends_with("    return cfg\nmax_iters = 100\n"));
    assert!(
        load("nanogpt_config.py")
            .set("training_args.new_key", &Scalar::Int(1))
            .is_err()
    );
    let e = Doc::parse(Path::new("bad.py"), "a = (1,\nb = 'x\n".into()).unwrap_err();
    assert!(matches!(e, FileError::Parse { line: 2, .. }), "{e}");
}

#[test]
fn diff_format() {
    assert_eq!(unified_diff("a", "b", "x\n", "x\n"), "");
    let old = "1\n2\n3\n4\n5\n6\n7\n8\n9\n";
    let new = old.replace("5\n", "five\n");
    let d = unified_diff("orig/ds.json", "attempt-2/ds.json", old, &new);
    assert_eq!(
        d,
        "--- orig/ds.json\n+++ attempt-2/ds.json\n@@ -2,7 +2,7 @@\n 2\n 3\n 4\n-5\n+five\n 6\n 7\n 8\n"
    );
}

#[test]
fn floats_render_for_every_reader() {
    assert_eq!(render::float(1.0), "1.0");
    assert_eq!(render::float(0.3), "0.3");
    assert_eq!(render::float(1e-5), "1.0e-5");
    assert_eq!(render::float(1e20), "1.0e+20");
    assert_eq!(plain::resolve("1.0e-5"), Scalar::Float(1e-5));
    assert_eq!(plain::resolve("1.0e+20"), Scalar::Float(1e20));
}

// ---------------------------------------------------------------------------
// The corpus of real commands (tests/fixtures/corpus/commands, copied from public repositories)

/// The corpus folder; panics when it is missing (it is part of the repository).
fn corpus() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/corpus/commands");
    assert!(
        p.is_dir(),
        "{} is missing: it is part of the repository (restore it with git checkout)",
        p.display()
    );
    p
}

fn config_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = rd.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            config_files(&p, out);
        } else {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let is_cfg = format_of(&p).is_some() || name.ends_with(".conf");
            if is_cfg && name != "labels.json" {
                out.push(p);
            }
        }
    }
}

/// The file a label names: the path in the case folder, else the one file
/// under it with that name.
fn resolve_file(case: &Path, file: &str) -> Option<PathBuf> {
    let direct = case.join(file);
    if direct.is_file() {
        return Some(direct);
    }
    let mut all = Vec::new();
    config_files(case, &mut all);
    let hits: Vec<PathBuf> = all.into_iter().filter(|p| p.ends_with(file)).collect();
    (hits.len() == 1).then(|| hits[0].clone())
}

struct Label {
    case: String,
    file: PathBuf,
    key: String,
    value: serde_json::Value,
}

fn labels(root: &Path) -> Vec<Label> {
    fn walk(case: &Path, name: &str, v: &serde_json::Value, out: &mut Vec<Label>) {
        let serde_json::Value::Object(o) = v else {
            return;
        };
        let in_file = matches!(
            o.get("where").and_then(|w| w.as_str()),
            None | Some("json" | "yaml" | "toml" | "python-config")
        );
        if let (Some(file), Some(key), true) = (
            o.get("file").and_then(|f| f.as_str()),
            o.get("key"),
            in_file,
        ) && let Some(path) = resolve_file(case, file)
        {
            let value = o.get("value").cloned().unwrap_or(serde_json::Value::Null);
            match (key, &value) {
                (serde_json::Value::String(k), _) => out.push(Label {
                    case: name.to_string(),
                    file: path,
                    key: k.clone(),
                    value,
                }),
                (serde_json::Value::Array(ks), serde_json::Value::Array(vs)) => {
                    for (k, v) in ks.iter().zip(vs) {
                        out.push(Label {
                            case: name.to_string(),
                            file: path.clone(),
                            key: k.as_str().unwrap_or_default().to_string(),
                            value: v.clone(),
                        });
                    }
                }
                _ => {}
            }
        }
        for child in o.values() {
            walk(case, name, child, out);
            if let serde_json::Value::Array(items) = child {
                for it in items {
                    walk(case, name, it, out);
                }
            }
        }
    }
    let mut out = Vec::new();
    let mut cases: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    cases.sort();
    for case in cases {
        let Ok(text) = std::fs::read_to_string(case.join("labels.json")) else {
            continue;
        };
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let name = case.file_name().unwrap().to_string_lossy().to_string();
        if let Some(knobs) = v.get("knobs") {
            walk(&case, &name, knobs, &mut out);
        }
    }
    out
}

fn scalar_of(v: &serde_json::Value) -> Option<Scalar> {
    Some(match v {
        serde_json::Value::Null => Scalar::Null,
        serde_json::Value::Bool(b) => Scalar::Bool(*b),
        serde_json::Value::Number(n) => match n.as_i64() {
            Some(i) => Scalar::Int(i),
            None => Scalar::Float(n.as_f64()?),
        },
        serde_json::Value::String(s) => Scalar::Str(s.clone()),
        _ => return None,
    })
}

/// Labels whose key is not the key inside the file (see the report).
fn file_key(l: &Label) -> String {
    // Hydra config groups: `data.batch_size` on the command line is
    // `batch_size` inside configs/data/mnist.yaml.
    if l.case.starts_with("53-") && l.key == "data.batch_size" {
        return "batch_size".into();
    }
    l.key.clone()
}

#[test]
fn corpus_every_config_file_loads() {
    let root = corpus();
    let mut files = Vec::new();
    config_files(&root, &mut files);
    assert!(files.len() >= 60, "found only {} config files", files.len());
    let mut failures = Vec::new();
    for f in &files {
        let r = Doc::load(f);
        let template = f.ends_with("ds_config_gpt_TEMPLATE.json");
        match (r, template) {
            (Ok(_), false) => {}
            (
                Err(FileError::Parse {
                    line: 2, message, ..
                }),
                true,
            ) if message.contains("expected a value") => {}
            (Ok(_), true) => failures.push(format!("{}: the sed template parsed", f.display())),
            (Err(e), _) => failures.push(e.to_string()),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn corpus_labelled_values_read_and_round_trip() {
    let root = corpus();
    let all = labels(&root);
    assert!(
        all.len() >= 100,
        "found only {} labelled keys in files",
        all.len()
    );
    let mut failures = Vec::new();
    let mut checked = 0;
    for l in &all {
        let what = format!(
            "{} {} {}",
            l.case,
            l.file.file_name().unwrap().to_string_lossy(),
            l.key
        );
        let doc = match Doc::load(&l.file) {
            Ok(d) => d,
            Err(FileError::Parse { .. }) if l.file.ends_with("ds_config_gpt_TEMPLATE.json") => {
                continue;
            }
            Err(e) => {
                failures.push(format!("{what}: {e}"));
                continue;
            }
        };
        let key = file_key(l);
        let got = doc.get(&key);
        match (scalar_of(&l.value), got) {
            (Some(want), Ok(Some(got))) if want == got => {
                checked += 1;
                if let Err(e) = round_trip(&l.file, &key) {
                    failures.push(format!("{what}: {e}"));
                }
            }
            // A list value (NBSS `batch_size: [2, 2]`).
            (None, Err(FileError::NotScalar { .. })) => checked += 1,
            // nanoGPT `gradient_accumulation_steps = 5 * 8`: labelled with the
            // expression, read as its value.
            (Some(Scalar::Str(expr)), Ok(Some(Scalar::Int(n))))
                if expr
                    .split('*')
                    .map(|f| f.trim().parse::<i64>().ok())
                    .product::<Option<i64>>()
                    == Some(n) =>
            {
                checked += 1
            }
            (want, got) => {
                failures.push(format!("{what}: label says {want:?}, file gives {got:?}"))
            }
        }
    }
    eprintln!("checked {checked} labelled keys");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn corpus_insertions_add_lines_only() {
    let root = corpus();
    let mut files = Vec::new();
    config_files(&root, &mut files);
    let mut failures = Vec::new();
    let mut done = (0, 0);
    for f in &files {
        let Ok(doc) = Doc::load(f) else { continue };
        let (key, value) = match doc.format() {
            Format::Json => (
                "zero_optimization.offload_optimizer.device",
                Scalar::Str("cpu".into()),
            ),
            Format::Yaml => ("gradient_checkpointing", Scalar::Bool(true)),
            _ => continue,
        };
        if !matches!(doc.get(key), Ok(None)) {
            continue;
        }
        let mut d = doc.clone();
        if let Err(e) = d.set(key, &value) {
            failures.push(format!("{}: {e}", f.display()));
            continue;
        }
        let re = Doc::parse(f, d.text().into()).unwrap();
        assert_eq!(re.get(key).unwrap(), Some(value.clone()), "{}", f.display());
        let diff = diff_of(&d, "copy");
        let (m, p) = changes(&diff);
        if !m.is_empty() || p.is_empty() {
            failures.push(format!("{}: not only added lines:\n{diff}", f.display()));
        }
        match doc.format() {
            Format::Json => done.0 += 1,
            _ => done.1 += 1,
        }
    }
    eprintln!("inserted into {} JSON and {} YAML files", done.0, done.1);
    assert!(done.0 >= 5 && done.1 >= 20, "{done:?}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn python_constant_arithmetic_is_read_and_replaced_whole() {
    // nanoGPT's config/train_gpt2.py: `gradient_accumulation_steps = 5 * 8`.
    let text = "batch_size = 12\ngradient_accumulation_steps = 5 * 8  # total across ranks\nbig = 2**10 // (1 + 1)\nname = f(3) * 2\nratio = 10 / 4\n";
    let mut d = Doc::parse(Path::new("train_gpt2.py"), text.into()).unwrap();
    assert_eq!(
        d.get("gradient_accumulation_steps").unwrap(),
        Some(Scalar::Int(40))
    );
    assert_eq!(d.get("big").unwrap(), Some(Scalar::Int(512)));
    // Calls and true division are not constants oomguard evaluates.
    assert!(d.get("name").is_err());
    assert!(d.get("ratio").is_err());
    d.set("gradient_accumulation_steps", &Scalar::Int(80))
        .unwrap();
    assert_eq!(
        d.text(),
        "batch_size = 12\ngradient_accumulation_steps = 80  # total across ranks\nbig = 2**10 // (1 + 1)\nname = f(3) * 2\nratio = 10 / 4\n"
    );
}

#[test]
fn whole_floats_keep_their_number_style() {
    let text = "{\n  \"micro\": 16.0,\n  \"accum\": 2e0,\n  \"big\": 1E3,\n  \"lr\": 1e-5\n}\n";
    let mut d = Doc::parse(Path::new("ds.json"), text.into()).unwrap();
    d.set("micro", &Scalar::Float(8.0)).unwrap();
    d.set("accum", &Scalar::Float(4.0)).unwrap();
    d.set("big", &Scalar::Float(500.0)).unwrap();
    d.set("lr", &Scalar::Float(2e-5)).unwrap();
    assert_eq!(
        d.text(),
        "{\n  \"micro\": 8.0,\n  \"accum\": 4e0,\n  \"big\": 500E0,\n  \"lr\": 2.0e-5\n}\n"
    );
}
