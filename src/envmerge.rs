//! Environment defaults, merged key by key and never overriding what the user set.

use std::collections::BTreeMap;
use std::ffi::OsString;

/// The allocator variables: `key:value,key:value` lists merged key by key.
const ALLOC_CONF: &str = "PYTORCH_CUDA_ALLOC_CONF";
/// The newer name (PyTorch 2.9+). When the user set it, defaults go there instead.
const ALLOC_CONF_NEW: &str = "PYTORCH_ALLOC_CONF";

/// One variable oomguard sets, and why it has this value.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EnvSet {
    pub name: String,
    pub value: String,
    /// "default" (user had none), "merged" (user's keys kept, defaults added),
    /// or "knob" (a knob bound to this variable).
    pub how: &'static str,
}

fn merge_conf(user: &str, defaults: &str) -> Option<String> {
    let key = |kv: &str| kv.split(':').next().unwrap_or("").trim().to_string();
    let have: Vec<String> = user
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(key)
        .collect();
    let extra: Vec<&str> = defaults
        .split(',')
        .map(str::trim)
        .filter(|kv| !kv.is_empty() && !have.contains(&key(kv)))
        .collect();
    if extra.is_empty() {
        return None;
    }
    let mut out = user.trim().trim_end_matches(',').to_string();
    for kv in extra {
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(kv);
    }
    Some(out)
}

/// The variables to set on top of the inherited environment.
pub fn merge(
    defaults: &BTreeMap<String, String>,
    user: &dyn Fn(&str) -> Option<OsString>,
) -> Vec<EnvSet> {
    let mut out = Vec::new();
    for (name, value) in defaults {
        let mut target = name.as_str();
        if name == ALLOC_CONF && user(ALLOC_CONF_NEW).is_some() {
            target = ALLOC_CONF_NEW;
        }
        let is_conf = target == ALLOC_CONF || target == ALLOC_CONF_NEW;
        match user(target) {
            None => out.push(EnvSet {
                name: target.to_string(),
                value: value.clone(),
                how: "default",
            }),
            Some(u) if is_conf => {
                let u = u.to_string_lossy();
                if let Some(merged) = merge_conf(&u, value) {
                    out.push(EnvSet {
                        name: target.to_string(),
                        value: merged,
                        how: "merged",
                    });
                }
            }
            Some(_) => {} // the user's value wins
        }
    }
    out
}

/// The allocator key that lets a segment grow instead of failing for want of
/// one free block of the requested size.
const EXPANDABLE: &str = "expandable_segments:True";

/// Set the allocator against fragmentation in `env` (the variables oomguard
/// adds): `expandable_segments:True` merged into the allocator variable
/// (the newer name when the user set that), unless the user's own value sets
/// the key, which wins. Returns what the retry runs with, in words.
pub fn against_fragmentation(
    env: &mut Vec<EnvSet>,
    user: &dyn Fn(&str) -> Option<OsString>,
) -> String {
    let target = if user(ALLOC_CONF_NEW).is_some() {
        ALLOC_CONF_NEW
    } else {
        ALLOC_CONF
    };
    let key = "expandable_segments";
    let has_key = |v: &str| {
        v.split(',')
            .any(|kv| kv.split(':').next().unwrap_or("").trim() == key)
    };
    let users = user(target).map(|u| u.to_string_lossy().into_owned());
    if let Some(u) = users.as_deref().filter(|u| has_key(u)) {
        return format!("your {target}={u} is kept");
    }
    if let Some(e) = env.iter_mut().find(|e| e.name == target) {
        if has_key(&e.value) {
            return format!("{target}={}", e.value);
        }
        if let Some(merged) = merge_conf(&e.value, EXPANDABLE) {
            e.value = merged;
        }
        return format!("{target}={}", e.value);
    }
    let (value, how) = match users.as_deref() {
        Some(u) => (
            merge_conf(u, EXPANDABLE).unwrap_or_else(|| u.to_string()),
            "merged",
        ),
        None => (EXPANDABLE.to_string(), "default"),
    };
    env.push(EnvSet {
        name: target.to_string(),
        value: value.clone(),
        how,
    });
    format!("{target}={value}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> BTreeMap<String, String> {
        [
            ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"),
            ("TOKENIZERS_PARALLELISM", "false"),
            ("PYTHONUNBUFFERED", "1"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
    }

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<OsString> {
        move |k| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.into())
    }

    /// The retry after an OOM while loading sets the allocator against
    /// fragmentation, key by key: a user's expandable_segments wins, a
    /// user's other keys stay, the newer variable name is used when the user
    /// set it, and a value oomguard already adds is left as it is.
    #[test]
    fn against_fragmentation_respects_the_users_key() {
        type Vars<'a> = &'a [(&'a str, &'a str)];
        type Case<'a> = (Vars<'a>, Vars<'a>, &'a str, Option<(&'a str, &'a str)>);
        let cases: &[Case] = &[
            // --no-env (nothing added), nothing set by the user.
            (
                &[],
                &[],
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                Some(("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")),
            ),
            // The user's own key wins: nothing added.
            (
                &[("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")],
                &[],
                "your PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False is kept",
                None,
            ),
            // The user's other keys are kept.
            (
                &[("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")],
                &[],
                "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128,expandable_segments:True",
                Some((
                    "PYTORCH_CUDA_ALLOC_CONF",
                    "max_split_size_mb:128,expandable_segments:True",
                )),
            ),
            // The newer name, when the user set it.
            (
                &[("PYTORCH_ALLOC_CONF", "garbage_collection_threshold:0.6")],
                &[],
                "PYTORCH_ALLOC_CONF=garbage_collection_threshold:0.6,expandable_segments:True",
                Some((
                    "PYTORCH_ALLOC_CONF",
                    "garbage_collection_threshold:0.6,expandable_segments:True",
                )),
            ),
            // oomguard's default already has it.
            (
                &[],
                &[("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")],
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                Some(("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")),
            ),
        ];
        for (user, added, said, want) in cases {
            let mut env: Vec<EnvSet> = added
                .iter()
                .map(|(n, v)| EnvSet {
                    name: n.to_string(),
                    value: v.to_string(),
                    how: "default",
                })
                .collect();
            let user: Vec<(String, String)> = user
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect();
            let lookup = move |k: &str| {
                user.iter()
                    .find(|(n, _)| n == k)
                    .map(|(_, v)| OsString::from(v))
            };
            assert_eq!(against_fragmentation(&mut env, &lookup), *said);
            let got = env
                .iter()
                .find(|e| e.name.contains("ALLOC_CONF"))
                .map(|e| (e.name.as_str(), e.value.as_str()));
            assert_eq!(got, *want, "{said}");
        }
    }

    #[test]
    fn empty_environment_gets_every_default() {
        let got = merge(&defaults(), &env_of(&[]));
        assert_eq!(got.len(), 3);
    }

    #[test]
    fn user_keys_are_kept_and_defaults_added() {
        let got = merge(
            &defaults(),
            &env_of(&[("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")]),
        );
        let conf = got
            .iter()
            .find(|e| e.name == "PYTORCH_CUDA_ALLOC_CONF")
            .unwrap();
        assert_eq!(conf.value, "max_split_size_mb:128,expandable_segments:True");
        assert_eq!(conf.how, "merged");
    }

    #[test]
    fn user_value_for_the_same_key_wins() {
        let got = merge(
            &defaults(),
            &env_of(&[
                ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False"),
                ("TOKENIZERS_PARALLELISM", "true"),
            ]),
        );
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].name, "PYTHONUNBUFFERED");
    }

    #[test]
    fn newer_name_receives_the_merge() {
        let got = merge(
            &defaults(),
            &env_of(&[("PYTORCH_ALLOC_CONF", "garbage_collection_threshold:0.6")]),
        );
        assert!(got.iter().all(|e| e.name != "PYTORCH_CUDA_ALLOC_CONF"));
        let conf = got.iter().find(|e| e.name == "PYTORCH_ALLOC_CONF").unwrap();
        assert_eq!(
            conf.value,
            "garbage_collection_threshold:0.6,expandable_segments:True"
        );
    }
}
