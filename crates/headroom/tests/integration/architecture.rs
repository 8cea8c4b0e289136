//! ARCHITECTURE.md's crate table says which workspace crates each crate depends on; this test
//! holds it to the `Cargo.toml` files, so the table a newcomer reads first stays true.

use std::collections::BTreeSet;
use std::path::Path;

/// The workspace crates a crate's `[dependencies]` name, without the `headroom-` prefix.
fn workspace_dependencies(manifest: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(manifest).expect("readable Cargo.toml");
    let manifest: toml::Table = toml::from_str(&text).expect("valid Cargo.toml");
    manifest
        .get("dependencies")
        .and_then(toml::Value::as_table)
        .into_iter()
        .flat_map(|dependencies| dependencies.keys())
        .filter_map(|name| name.strip_prefix("headroom-"))
        .map(str::to_string)
        .collect()
}

/// `(crate, dependencies)` for each row of the table under `## Crates`.
fn table_rows(architecture: &str) -> Vec<(String, BTreeSet<String>)> {
    let table = architecture
        .split("## Crates")
        .nth(1)
        .expect("ARCHITECTURE.md has a `## Crates` section");
    table
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2)
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let name = cells[1].trim_matches('`').to_string();
            let dependencies = cells[cells.len() - 2]
                .split(',')
                .map(str::trim)
                .filter(|dependency| !dependency.is_empty() && *dependency != "—")
                .map(str::to_string)
                .collect();
            (name, dependencies)
        })
        .collect()
}

#[test]
fn the_crate_table_matches_the_manifests() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let architecture =
        std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("readable ARCHITECTURE.md");
    let rows = table_rows(&architecture);
    let mut crates: Vec<String> = std::fs::read_dir(root.join("crates"))
        .expect("crates/")
        .map(|entry| {
            entry
                .expect("readable")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| root.join("crates").join(name).join("Cargo.toml").exists())
        .collect();
    crates.sort();
    let mut listed: Vec<String> = rows.iter().map(|(name, _)| name.clone()).collect();
    listed.sort();
    assert_eq!(listed, crates, "every crate has exactly one row");
    for (name, dependencies) in rows {
        let manifest = root.join("crates").join(&name).join("Cargo.toml");
        assert_eq!(
            dependencies,
            workspace_dependencies(&manifest),
            "ARCHITECTURE.md's row for {name} against {}",
            manifest.display()
        );
    }
}
