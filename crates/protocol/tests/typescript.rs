//! The TypeScript in `web/src/generated/` is what ts-rs makes of the protocol types the web client
//! reads (a message's stored metadata and the `CUSTOM` events it shows): this test fails when a
//! type changed and the files were not generated again, or when a file there is no longer made.
//!
//! To write them: `SB_UPDATE_TS=1 cargo nextest run -p switchboard-protocol --test typescript`.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use switchboard_protocol::files::GeneratedAttachments;
use switchboard_protocol::metadata::AgentChatMessageMetadata;
use switchboard_protocol::ui_schema::UiHintsEvent;
use ts_rs::{Config, TS};

/// Where the web client keeps them.
fn checked_in_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../web/src/generated")
}

/// Every type the web client reads, and what each needs, into `dir` (JSON numbers are
/// `number` in TypeScript, whatever the Rust integer).
fn export(dir: &Path) -> Result<(), ts_rs::ExportError> {
    let cfg = Config::new().with_large_int("number").with_out_dir(dir);
    AgentChatMessageMetadata::export_all(&cfg)?;
    UiHintsEvent::export_all(&cfg)?;
    GeneratedAttachments::export_all(&cfg)?;
    Ok(())
}

/// The files under `dir` by path relative to it, with their text.
fn files(dir: &Path) -> io::Result<BTreeMap<PathBuf, String>> {
    let mut found = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        for entry in fs::read_dir(&folder)? {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let text = fs::read_to_string(&path)?;
                let relative = path.strip_prefix(dir).unwrap_or(&path).to_path_buf();
                found.insert(relative, text);
            }
        }
    }
    Ok(found)
}

#[test]
fn the_checked_in_typescript_is_what_the_rust_types_generate() {
    let fresh = std::env::temp_dir().join(format!("switchboard-ts-{}", std::process::id()));
    let _ = fs::remove_dir_all(&fresh);
    export(&fresh).expect("ts-rs exports the types");
    let generated = files(&fresh).expect("the exported files read back");
    fs::remove_dir_all(&fresh).expect("the scratch folder is removed");
    let dir = checked_in_dir();
    if std::env::var_os("SB_UPDATE_TS").is_some() {
        let _ = fs::remove_dir_all(&dir);
        for (path, text) in &generated {
            let path = dir.join(path);
            fs::create_dir_all(path.parent().expect("a file has a folder")).expect("mkdir");
            fs::write(&path, text).expect("write");
        }
        return;
    }
    let checked_in = files(&dir).unwrap_or_default();
    let update = "generate them again: SB_UPDATE_TS=1 cargo nextest run -p switchboard-protocol --test typescript";
    assert_eq!(
        checked_in.keys().collect::<Vec<_>>(),
        generated.keys().collect::<Vec<_>>(),
        "web/src/generated/ does not hold the files the types make; {update}"
    );
    for (path, text) in &generated {
        assert_eq!(
            &checked_in[path],
            text,
            "web/src/generated/{} differs from what its Rust type generates; {update}",
            path.display()
        );
    }
}
