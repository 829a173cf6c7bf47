//! What puppet-kicker writes into `cache.dir`: who may write there, the modes of its
//! files, and what a full disk or a planted symlink does.

use puppet_kicker::cache_dir::CacheDirError;
use puppet_kicker::facts::Node;
use puppet_kicker::snapshot::{self, SnapshotRef};
use puppet_kicker::Index;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use support::{require_root, ScratchDir, Tmpfs};

mod support;

/// A scratch directory for the test, removed when it ends.
fn tempdir(name: &str) -> ScratchDir {
    ScratchDir::new(&format!("pk-cache-files-{name}"))
}

/// An index of `nodes` servers, each with `padding` bytes of a fact of its own.
fn snapshot(nodes: usize, padding: usize) -> Index {
    let nodes = (0..nodes)
        .map(|i| {
            let facts = serde_json::json!({"role": "web", "padding": format!("{i}{}", "x".repeat(padding))});
            Node::new(format!("web{i}.example.com"), facts.as_object().cloned().unwrap(), 1000, None)
        })
        .collect();
    Index::build(nodes, "role", 1000)
}

/// Writes `index`; the error as the warning an operator reads.
fn write(path: &Path, index: &Index) -> Result<(), String> {
    snapshot::write(path, &SnapshotRef::of(index, &BTreeMap::new())).map_err(|e| e.to_string())
}

/// The servers of the snapshot at `path`, as nodes.
fn read(path: &Path) -> Vec<Node> {
    let snap = snapshot::read(path, "role").unwrap().expect("a snapshot");
    snap.index.servers().map(|s| s.to_node()).collect()
}

fn nodes(index: &Index) -> Vec<Node> {
    index.servers().map(|s| s.to_node()).collect()
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().mode() & 0o7777
}

#[test]
fn files_are_private_and_a_new_cache_dir_is_0750() {
    let root = tempdir("modes");
    let dir = root.join("var/puppet_kicker");
    let path = snapshot::path_in(&dir);
    write(&path, &snapshot(2, 10)).unwrap();
    assert_eq!(mode(&dir), 0o750);
    assert_eq!(mode(&path), 0o600, "the snapshot holds the whole fleet's facts");
    // Rewritten over a file someone made readable: the new one is private again.
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    write(&path, &snapshot(3, 10)).unwrap();
    assert_eq!(mode(&path), 0o600);
    assert_eq!(read(&path).len(), 3);
    fs::remove_dir_all(&root).unwrap();
}

#[test]
fn a_planted_symlink_cannot_redirect_the_write() {
    let dir = tempdir("symlink");
    let victim = dir.join("victim");
    fs::write(&victim, "precious").unwrap();
    let cache = dir.join("cache");
    fs::create_dir(&cache).unwrap();
    // The names the temporary file used to have: pid and a counter from 0.
    for counter in 0..64 {
        let name = format!(".{}.{}.{counter}.tmp", snapshot::FILE_NAME, std::process::id());
        std::os::unix::fs::symlink(&victim, cache.join(name)).unwrap();
    }
    // And the snapshot itself: the rename replaces the link, never its target.
    let path = snapshot::path_in(&cache);
    std::os::unix::fs::symlink(&victim, &path).unwrap();
    write(&path, &snapshot(1, 10)).unwrap();
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
    assert!(!fs::symlink_metadata(&path).unwrap().file_type().is_symlink());
    assert_eq!(read(&path).len(), 1);
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_cache_dir_others_can_write_is_refused_with_what_to_change() {
    let root = tempdir("writable");
    let dir = root.join("cache");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
    let path = snapshot::path_in(&dir);
    let err = write(&path, &snapshot(1, 10)).unwrap_err();
    assert!(err.contains(&dir.display().to_string()) && err.contains("writable by every user"), "{err}");
    assert!(err.contains(&format!("chmod o-w {}", dir.display())), "{err}");
    assert!(!path.exists());
    // Reading from it is refused too: anyone could have put the snapshot there.
    fs::write(&path, b"PKINDEX\0").unwrap();
    let err = snapshot::read(&path, "role").unwrap_err();
    assert!(
        matches!(&err, snapshot::SnapshotError::UnsafeDir { source: CacheDirError::WritableByOthers { .. }, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("writable by every user"), "{err}");

    // Group-writable is fine when the directory is ours (a shared puppet group)
    // (not when someone else owns it: the next test).
    fs::remove_file(&path).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o770)).unwrap();
    write(&path, &snapshot(1, 10)).unwrap();
    fs::remove_dir_all(&root).unwrap();
}

#[test]
#[ignore = "needs root"]
fn a_cache_dir_someone_else_owns_is_refused_when_group_writable_and_used_when_not() {
    require_root();
    let root = tempdir("foreign");
    let dir = root.join("cache");
    fs::create_dir(&dir).unwrap();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o770)).unwrap();
    let path = snapshot::path_in(&dir);
    // Group-writable and someone else's: refused.
    std::os::unix::fs::chown(&dir, Some(4242), None).unwrap();
    let err = write(&path, &snapshot(1, 10)).unwrap_err();
    assert!(err.contains("writable by its group") && err.contains("owned by uid 4242"), "{err}");
    assert!(err.contains(&format!("chmod g-w {}", dir.display())), "{err}");
    // Owned by someone else and not writable by others: fine (root's `puppet apply`
    // in the directory of puppetserver's user), and the file it writes is theirs.
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o750)).unwrap();
    std::os::unix::fs::chown(&dir, Some(4242), Some(4343)).unwrap();
    write(&path, &snapshot(2, 10)).unwrap();
    let meta = fs::metadata(&path).unwrap();
    assert_eq!((meta.uid(), meta.gid(), meta.mode() & 0o777), (4242, 4343, 0o600));

    // A symlink someone else owns is refused, wherever it points.
    let link = root.join("link");
    std::os::unix::fs::symlink(&dir, &link).unwrap();
    std::os::unix::fs::lchown(&link, Some(4242), None).unwrap();
    let err = write(&snapshot::path_in(&link), &snapshot(1, 10)).unwrap_err();
    assert!(err.contains("symlink owned by uid 4242"), "{err}");
    fs::remove_dir_all(&root).unwrap();
}

#[test]
#[ignore = "needs root"]
fn a_full_disk_keeps_the_old_snapshot_and_the_next_write_succeeds() {
    let dir = tempdir("enospc");
    let tmpfs = Tmpfs::mount(&dir, 256 << 10);
    let path = snapshot::path_in(&dir);
    let old = snapshot(10, 1000);
    write(&path, &old).unwrap();

    let filler = dir.join("filler");
    let free = 256 * 1024 - fs::metadata(&path).unwrap().len() as usize;
    let _ = fs::write(&filler, vec![0u8; free]);
    let new = snapshot(40, 1000);
    let err = write(&path, &new).unwrap_err();
    assert!(err.contains("No space left on device") && err.contains("the previous snapshot is kept"), "{err}");
    assert_eq!(read(&path), nodes(&old), "the old snapshot is intact");
    let names: Vec<_> = fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 2, "no temporary file left behind: {names:?}");

    fs::remove_file(&filler).unwrap();
    write(&path, &new).unwrap();
    assert_eq!(read(&path), nodes(&new));
    drop(tmpfs);
    fs::remove_dir_all(&dir).unwrap();
}
