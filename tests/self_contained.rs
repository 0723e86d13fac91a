//! The tests depend on nothing outside the repository: a test that reads a folder beside
//! the clone (a `shared` folder next to it) checks nothing in a clone without it. Fixtures the
//! tests need are copied under `tests/fixtures/`.

use std::path::{Path, PathBuf};

/// Built with `concat!` so that this file does not match itself.
const OUTSIDE: [&str; 2] = [concat!("..", "/shared"), concat!("/shared", "/fixtures")];

/// The test code: `.rs`, `.sh` and `.py` files under `dir`, except the fixtures (data,
/// some of it other people's text).
fn test_code(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if !path.ends_with("tests/fixtures") {
                test_code(&path, out);
            }
        } else if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("rs" | "sh" | "py")
        ) {
            out.push(path);
        }
    }
}

#[test]
fn no_test_reads_a_folder_outside_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    // src/ too: the unit tests live there.
    for dir in ["tests", "src"] {
        test_code(&root.join(dir), &mut files);
    }
    assert!(
        files.iter().any(|f| f.ends_with("tests/real_clients.rs")),
        "the walk found no test files: {files:?}"
    );
    let mut hits = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for (n, line) in text.lines().enumerate() {
            if OUTSIDE.iter().any(|needle| line.contains(needle)) {
                hits.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
            }
        }
    }
    assert!(
        hits.is_empty(),
        "test code refers to a folder outside the repository (copy what it needs under \
         tests/fixtures/ instead):\n{}",
        hits.join("\n")
    );
}
