//! `--output-dir`: one OTLP `ProfilesData` protobuf file per export, for
//! air-gapped hosts; the oldest files are removed once the directory's
//! profiles pass the size bound.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

const PREFIX: &str = "profiles-";
const SUFFIX: &str = ".otlp.pb";

pub struct Files {
    dir: PathBuf,
    max_bytes: u64,
    written: u64,
}

impl Files {
    /// Creates the directory when needed, and checks that files can be
    /// written in it: otherwise the agent would sample for a whole interval
    /// before finding out.
    pub fn new(dir: &Path, max_bytes: u64) -> io::Result<Files> {
        fs::create_dir_all(dir)?;
        otel_thread_ctx_formats::check_writable(
            &dir.join(format!(".{PREFIX}check{SUFFIX}.partial")),
        )?;
        Ok(Files {
            dir: dir.to_path_buf(),
            max_bytes,
            written: 0,
        })
    }

    /// Writes one export (whole, then renamed into place: a reader never
    /// sees half a file), then removes the oldest files past the bound.
    /// Returns the file's path.
    pub fn write(&mut self, unix_ns: u64, bytes: &[u8]) -> io::Result<PathBuf> {
        // Names sort by time: the wall clock, then a sequence number for
        // exports within one millisecond.
        let name = format!(
            "{PREFIX}{:013}-{:06}{SUFFIX}",
            unix_ns / 1_000_000,
            self.written % 1_000_000
        );
        self.written += 1;
        let path = self.dir.join(&name);
        let partial = self.dir.join(format!(".{name}.partial"));
        fs::write(&partial, bytes)?;
        fs::rename(&partial, &path)?;
        self.prune(&path)?;
        Ok(path)
    }

    /// Removes the oldest profiles until the rest fit in the bound; the one
    /// just written is always kept.
    fn prune(&self, newest: &Path) -> io::Result<()> {
        let mut files: Vec<(String, u64)> = fs::read_dir(&self.dir)?
            .filter_map(|e| {
                let e = e.ok()?;
                let name = e.file_name().into_string().ok()?;
                (name.starts_with(PREFIX) && name.ends_with(SUFFIX))
                    .then(|| Some((name, e.metadata().ok()?.len())))?
            })
            .collect();
        files.sort();
        let mut total: u64 = files.iter().map(|(_, n)| n).sum();
        for (name, size) in files {
            if total <= self.max_bytes {
                break;
            }
            let path = self.dir.join(&name);
            if path == newest {
                break;
            }
            fs::remove_file(&path)?;
            total -= size;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_files_cannot_be_written_in_is_refused_at_once() {
        // It exists, so creating it succeeds; no file can be made in it.
        assert!(Files::new(Path::new("/proc"), 250).is_err());
        assert!(Files::new(Path::new("/proc/self/nonexistent"), 250).is_err());
        let dir = std::env::temp_dir().join(format!(
            "otel-thread-ctx-files-check-{}",
            std::process::id()
        ));
        let _ = fs::remove_dir_all(&dir);
        Files::new(&dir, 250).unwrap();
        // The check leaves nothing behind.
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_oldest_files_go_past_the_bound() {
        let dir =
            std::env::temp_dir().join(format!("otel-thread-ctx-files-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let mut files = Files::new(&dir, 250).unwrap();
        let first = files.write(1_000_000_000, &[1; 100]).unwrap();
        let second = files.write(2_000_000_000, &[2; 100]).unwrap();
        assert!(first.exists() && second.exists());
        let third = files.write(3_000_000_000, &[3; 100]).unwrap();
        assert!(!first.exists(), "the oldest file is removed past 250 bytes");
        assert!(second.exists() && third.exists());
        // One file larger than the bound is still written and kept.
        let big = files.write(4_000_000_000, &[4; 1000]).unwrap();
        assert!(big.exists());
        assert!(!second.exists() && !third.exists());
        assert_eq!(fs::read(&big).unwrap().len(), 1000);
        fs::remove_dir_all(&dir).unwrap();
    }
}
