//! docs/configuration.md is the reference generated from kvc-server's clap
//! definitions: this fails when a flag is missing from it or any text
//! differs. `KVC_UPDATE_DOCS=1 cargo test -p kvc-server --test
//! configuration_reference` regenerates it.

use clap::CommandFactory;
use kvc_server::args::Args;
use kvc_server::config_reference::{documented_args, render};

fn doc_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md")
}

#[test]
fn the_configuration_reference_documents_every_flag_as_generated() {
    let cmd = Args::command();
    let want = render(&cmd);
    let path = doc_path();
    if std::env::var_os("KVC_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{} missing ({e}); generate it with KVC_UPDATE_DOCS=1", path.display()));
    let missing: Vec<String> = documented_args(&cmd)
        .iter()
        .filter_map(|a| a.get_long())
        .filter(|l| !have.contains(&format!("### `--{l}")))
        .map(|l| format!("--{l}"))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/configuration.md lacks {missing:?}; regenerate it: KVC_UPDATE_DOCS=1 cargo test -p kvc-server --test configuration_reference"
    );
    if have != want {
        let line = have.lines().zip(want.lines()).position(|(a, b)| a != b).unwrap_or(have.lines().count().min(want.lines().count()));
        panic!(
            "docs/configuration.md differs from the flags (first at line {}: have {:?}, want {:?}); regenerate it: \
             KVC_UPDATE_DOCS=1 cargo test -p kvc-server --test configuration_reference",
            line + 1,
            have.lines().nth(line),
            want.lines().nth(line)
        );
    }
}
