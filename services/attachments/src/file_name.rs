//! File names from clients and agents, and the object keys made from them. A name is never
//! trusted: what is kept is its last path component without control characters (shown back to
//! the owner), and what reaches S3 is a storage-safe rendering of it under a key of our own
//! (`<prefix>/<owner digest>/<file id>/<safe name>`), so no name can choose or escape its key.

use uuid::Uuid;

/// Longest file name accepted, in characters.
pub(crate) const MAX_FILE_NAME_CHARS: usize = 255;

/// The last path component of a client's file name, without control characters; `None` when
/// nothing is left (or only `.` or `..`).
pub(crate) fn base_name(raw: &str) -> Option<String> {
    let last = raw.rsplit(['/', '\\']).next().unwrap_or_default();
    let clean: String = last.chars().filter(|c| !c.is_control()).collect();
    let clean = clean.trim();
    (!clean.is_empty() && clean != "." && clean != "..").then(|| clean.to_owned())
}

/// A storage-safe rendering of a file name: ASCII letters, digits, `.`, `-`, `_`; never raw.
pub(crate) fn key_name(file_name: &str) -> String {
    let mut safe: String = file_name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    safe = safe.trim_matches('.').chars().take(100).collect();
    if safe.is_empty() {
        "file".to_owned()
    } else {
        safe
    }
}

/// A fresh object key for `owner`'s uploaded file.
pub(crate) fn upload_key(owner: &str, id: Uuid, file_name: &str) -> String {
    owned_key("uploads", owner, id, file_name)
}

/// The object key of a file an agent generated for `owner`.
pub(crate) fn generated_key(owner: &str, id: Uuid, file_name: &str) -> String {
    owned_key("generated", owner, id, file_name)
}

fn owned_key(prefix: &str, owner: &str, id: Uuid, file_name: &str) -> String {
    let owner_dir = &protocol::messaging::digest(&[owner])[..32];
    format!("{prefix}/{owner_dir}/{id}/{}", key_name(file_name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_parts_are_stripped_from_file_names_and_keys_are_safe() {
        assert_eq!(base_name("../../etc/passwd").as_deref(), Some("passwd"));
        assert_eq!(
            base_name("C:\\Users\\me\\báo cáo.pdf").as_deref(),
            Some("báo cáo.pdf")
        );
        assert_eq!(base_name("dir/"), None);
        assert_eq!(key_name("báo cáo (1).pdf"), "b_o_c_o__1_.pdf");
        assert_eq!(key_name("..."), "file");
    }

    #[test]
    fn keys_are_per_owner_and_file_under_their_prefix() {
        let id = Uuid::from_u128(7);
        let key = upload_key("alice", id, "../a b.pdf");
        let parts: Vec<&str> = key.split('/').collect();
        assert_eq!(parts.len(), 4, "{key}");
        assert_eq!(parts[0], "uploads");
        assert_eq!(
            parts[1].len(),
            32,
            "the owner's digest, never the owner: {key}"
        );
        assert_ne!(
            parts[1],
            upload_key("bob", id, "a")
                .split('/')
                .nth(1)
                .unwrap_or_default()
        );
        assert_eq!(parts[2], id.to_string());
        assert_eq!(parts[3], "_a_b.pdf");
        assert!(
            generated_key("alice", id, "x.csv").starts_with(&format!("generated/{}/", parts[1]))
        );
    }
}
