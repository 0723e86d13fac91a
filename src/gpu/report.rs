//! `oomguard gpus [--json]`: what each visible GPU holds, and who holds it.
//!
//! Exit codes: 0 when the GPUs could be read (even if none is visible);
//! [`NO_GPU_INFO`] (69) when they cannot: no NVML (no driver), NVML failed, or the fake
//! timeline is unreadable — one line on stderr says which. With `--json` stdout always
//! has one JSON object, then `{"gpus": [], "error": "..."}`: a script reading it never
//! finds nothing.

use serde_json::json;

use super::{GpuState, NO_GPU_INFO, gib, try_open_probe, visible};
use crate::exit;

pub fn gpus_main(json: bool) -> i32 {
    let cvd = std::env::var("CUDA_VISIBLE_DEVICES").ok();
    let failed = |error: String| {
        crate::report::terminal::get().say(&error);
        if json {
            println!("{}", render_error_json(&error, cvd.as_deref()));
        }
        NO_GPU_INFO
    };
    let mut probe = match try_open_probe() {
        Ok(p) => p,
        Err(e) => return failed(e.to_string()),
    };
    let all = match probe.gpus() {
        Ok(all) => all,
        Err(e) => return failed(format!("cannot read the GPUs: {e}")),
    };
    let shown = visible(&all, cvd.as_deref());
    if json {
        println!("{}", render_json(&all, &shown, cvd.as_deref()));
    } else {
        print!("{}", render_text(&all, &shown, cvd.as_deref()));
    }
    exit::SUCCESS
}

/// `gpus --json` when the GPUs cannot be read (exit 69): the same keys, no GPU, and
/// `error`, the line printed on stderr.
pub fn render_error_json(error: &str, cvd: Option<&str>) -> String {
    json!({ "cuda_visible_devices": cvd, "gpus": [], "error": error }).to_string()
}

/// One JSON object: `cuda_visible_devices` (string or null), `error` (null), and `gpus`,
/// each with `cuda_index` (its `cuda:N` for a process started here), `index`, `uuid`,
/// `name`, `total_bytes`, `used_bytes`, `free_bytes`, `util_percent` and `processes`
/// (`pid`, `used_bytes`, `user`, `oomguard_attempt`).
pub fn render_json(all: &[GpuState], shown: &[u32], cvd: Option<&str>) -> String {
    let gpus: Vec<serde_json::Value> = shown
        .iter()
        .enumerate()
        .filter_map(|(cuda, i)| {
            let g = all.iter().find(|g| g.index == *i)?;
            let mut v = serde_json::to_value(g).ok()?;
            v.as_object_mut()?.insert("cuda_index".into(), json!(cuda));
            Some(v)
        })
        .collect();
    json!({ "cuda_visible_devices": cvd, "gpus": gpus, "error": null }).to_string()
}

/// The human form:
///
/// ```text
/// GPU 0  NVIDIA H100 80GB HBM3  GPU-5f3c1a2b-...
///   71.2 of 79.6 GiB used, 8.4 GiB free; utilisation 97%
///   pid 12345  alice  70.1 GiB  oomguard run (attempt 4242.0.1732000000)
///   pid 23456  bob     1.0 GiB
/// ```
pub fn render_text(all: &[GpuState], shown: &[u32], cvd: Option<&str>) -> String {
    let mut s = String::new();
    if let Some(v) = cvd {
        s += &format!(
            "CUDA_VISIBLE_DEVICES={v}: {} of {} GPUs visible\n",
            shown.len(),
            all.len()
        );
    }
    if shown.is_empty() {
        s += "no GPU visible\n";
        return s;
    }
    for (cuda, i) in shown.iter().enumerate() {
        let Some(g) = all.iter().find(|g| g.index == *i) else {
            continue;
        };
        s += &format!("GPU {}", g.index);
        if cvd.is_some() {
            s += &format!(" (cuda:{cuda})");
        }
        s += &format!("  {}  {}\n", g.name, g.uuid);
        s += &format!(
            "  {} of {} used, {} free",
            gib(g.used).trim_end_matches(" GiB"),
            gib(g.total),
            gib(g.free)
        );
        if let Some(u) = g.util_percent {
            s += &format!("; utilisation {u}%");
        }
        s += "\n";
        if g.processes.is_empty() {
            s += "  no process holds memory\n";
            continue;
        }
        let users: Vec<&str> = g
            .processes
            .iter()
            .map(|p| p.user.as_deref().unwrap_or("?"))
            .collect();
        let pid_w = g
            .processes
            .iter()
            .map(|p| p.pid.to_string().len())
            .max()
            .unwrap_or(1);
        let user_w = users.iter().map(|u| u.len()).max().unwrap_or(1);
        let mem: Vec<String> = g.processes.iter().map(|p| gib(p.used)).collect();
        let mem_w = mem.iter().map(String::len).max().unwrap_or(1);
        for ((p, user), mem) in g.processes.iter().zip(&users).zip(&mem) {
            let mut line = format!("  pid {:<pid_w$}  {user:<user_w$}  {mem:>mem_w$}", p.pid);
            if let Some(a) = &p.oomguard_attempt {
                line += &format!("  oomguard run (attempt {a})");
            }
            s += line.trim_end();
            s += "\n";
        }
    }
    s
}
