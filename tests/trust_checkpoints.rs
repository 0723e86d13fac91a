//! Trust: a relaunch continues this run, and nothing that names files in a
//! checkpoint folder reaches out of it. These drive the real binary.

mod common;
use common::*;

use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn a_resume_table_cannot_reach_outside_the_checkpoint_or_drop_its_flag() {
    let tmp = tempfile::tempdir().unwrap();
    for (body, line, key) in [
        (
            "[resume]\nflag = \"--resume_from\"\ndir = \"out\"\npattern = \"step_{step}\"\ncomplete_when = [\"model.pt\", \"../../etc/passwd\"]\n",
            5,
            "resume.complete_when",
        ),
        (
            "[resume]\nflag = \"--resume_from\"\ndir = \"out\"\npattern = \"step_{step}\"\ncomplete_when = [\"/etc/passwd\"]\n",
            5,
            "resume.complete_when",
        ),
        (
            "[resume]\ndir_flag = \"--output_dir\"\nflag = \"\"\npattern = \"step_{step}\"\n",
            3,
            "resume.flag",
        ),
    ] {
        let p = tmp.path().join("p.toml");
        std::fs::write(
            &p,
            format!("[[step]]\nkind = \"halve_micro_batch\"\n\n{body}"),
        )
        .unwrap();
        let run = oomguard(
            tmp.path(),
            &["--policy", p.to_str().unwrap(), "true"],
            None,
            LIMIT,
        );
        run.check("exit code", Some(2), run.code);
        let want = format!("{}:{}: {key}:", p.display(), line + 3);
        run.ensure(
            "the error names file:line:key",
            run.stderr.contains(&want),
            &want,
            &run.stderr,
        );
    }
}
