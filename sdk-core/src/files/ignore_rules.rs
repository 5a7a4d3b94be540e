//! `TransferOptions::ignore_file`: ignore files (".gitignore" syntax, the
//! `ignore` crate's matcher) found anywhere in the tree being sent, each
//! applying to its own directory and below, the deeper one winning, as git
//! reads nested `.gitignore` files. The same rules serve uploads (the
//! local tree's files) and downloads (the sandbox's, read over SFTP).

use std::path::{Path, PathBuf};

use ignore::gitignore::{Gitignore, GitignoreBuilder};

/// A virtual root for tree-relative paths, so that every matcher strips
/// its own directory from the paths it is asked about.
const ROOT: &str = "/tree";
/// Largest ignore file read; larger ones are read up to this much.
pub(super) const MAX_IGNORE_FILE: usize = 1 << 20;

/// The rules in force at one directory of the walk.
#[derive(Clone, Default)]
pub(super) struct IgnoreRules {
    /// Matchers from the top of the tree down to the current directory.
    stack: Vec<Gitignore>,
}

impl IgnoreRules {
    /// These rules plus those of the ignore file in directory `dir`
    /// (relative to the tree), whose text is `contents`.
    pub fn with_file(&self, dir: &Path, contents: &str) -> Self {
        let root = Path::new(ROOT).join(dir);
        let mut builder = GitignoreBuilder::new(&root);
        for line in contents.lines() {
            // A bad pattern is skipped, as git skips it.
            let _ = builder.add_line(None, line);
        }
        let mut stack = self.stack.clone();
        if let Ok(matcher) = builder.build() {
            stack.push(matcher);
        }
        Self { stack }
    }

    /// Whether `path` (relative to the tree) is ignored.
    pub fn ignored(&self, path: &Path, is_dir: bool) -> bool {
        let full: PathBuf = Path::new(ROOT).join(path);
        for matcher in self.stack.iter().rev() {
            let matched = matcher.matched(&full, is_dir);
            if matched.is_ignore() {
                return true;
            }
            if matched.is_whitelist() {
                return false;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_files_apply_below_their_directory_and_win() {
        let top = IgnoreRules::default().with_file(Path::new(""), "*.log\nbuild/\n");
        assert!(top.ignored(Path::new("a.log"), false));
        assert!(top.ignored(Path::new("sub/b.log"), false));
        assert!(top.ignored(Path::new("build"), true));
        assert!(!top.ignored(Path::new("build"), false));
        assert!(!top.ignored(Path::new("main.rs"), false));
        let sub = top.with_file(Path::new("sub"), "!keep.log\n/local.txt\n");
        assert!(!sub.ignored(Path::new("sub/keep.log"), false));
        assert!(sub.ignored(Path::new("sub/other.log"), false));
        assert!(sub.ignored(Path::new("sub/local.txt"), false));
        assert!(!sub.ignored(Path::new("sub/deeper/local.txt"), false));
        assert!(!top.ignored(Path::new("local.txt"), false));
    }
}
