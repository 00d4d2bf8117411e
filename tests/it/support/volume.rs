//! A small filesystem of its own (a tmpfs of a given size, mounted on a
//! temp dir, unmounted on drop): a data volume that misses can fill and a
//! test can fill to the last byte. Mounting needs root (or
//! `CAP_SYS_ADMIN`): elsewhere [`SmallVolume::mount`] answers `None` and
//! the test says it did not run.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct SmallVolume {
    dir: tempfile::TempDir,
}

impl SmallVolume {
    /// A tmpfs of `bytes`, or `None` where this process may not mount.
    pub fn mount(bytes: u64) -> Option<SmallVolume> {
        let dir = tempfile::tempdir().expect("tmp");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={bytes}"))
            .arg("tmpfs")
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("not run: this process cannot mount a tmpfs (needs root or CAP_SYS_ADMIN)");
        }
        mounted.then_some(SmallVolume { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills what is left with one file, to the last block; returns it.
    pub fn fill(&self) -> PathBuf {
        let path = self.path().join("filler");
        let mut f = std::fs::File::create(&path).expect("filler");
        for chunk in [1 << 20, 4096, 1] {
            let block = vec![0x5au8; chunk];
            while f.write_all(&block).and_then(|()| f.flush()).is_ok() {}
        }
        path
    }

    /// Free bytes on the volume now.
    pub fn free(&self) -> u64 {
        let out = Command::new("df")
            .args(["--output=avail", "-B1"])
            .arg(self.path())
            .output()
            .expect("df runs");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .expect("df's figure")
    }
}

impl Drop for SmallVolume {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}
