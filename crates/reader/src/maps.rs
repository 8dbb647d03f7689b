//! `/proc/<pid>/maps`: the memory mappings of the target process.

use std::fs;
use std::io;

/// One line of `/proc/<pid>/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First address of the mapping.
    pub start: u64,
    /// One past the last address of the mapping.
    pub end: u64,
    /// Permission string as the kernel prints it, e.g. `r-xp`.
    pub perms: String,
    /// Offset in the backing file (0 for anonymous mappings).
    pub offset: u64,
    /// Inode of the backing file (0 for anonymous mappings).
    pub inode: u64,
    /// Path or pseudo-name (`[heap]`, `/memfd:NAME (deleted)`); empty when anonymous.
    pub path: String,
}

impl Mapping {
    /// The path without the ` (deleted)` suffix the kernel appends for
    /// unlinked files (memfds always carry it).
    pub fn name(&self) -> &str {
        self.path.strip_suffix(" (deleted)").unwrap_or(&self.path)
    }

    /// True when the mapping is backed by a regular file that may be an ELF
    /// object (not a pseudo-file, not anonymous memory).
    pub fn is_file_backed(&self) -> bool {
        self.inode != 0
            && self.path.starts_with('/')
            && !self.path.starts_with("/memfd:")
            && !self.path.starts_with("/dev/")
    }

    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    /// Whether the mapping covers no byte (the kernel lists none such).
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// Reads and parses `/proc/<pid>/maps`.
pub fn read(pid: i32) -> io::Result<Vec<Mapping>> {
    Ok(parse(&fs::read_to_string(format!("/proc/{pid}/maps"))?))
}

/// Parses the text of a maps file, skipping malformed lines.
pub fn parse(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mapping> {
    // Five space-separated fields, then the path, which may itself contain
    // spaces and is padded with a run of spaces.
    let mut rest = line;
    let mut fields = [""; 5];
    for field in &mut fields {
        rest = rest.trim_start_matches(' ');
        let end = rest.find(' ').unwrap_or(rest.len());
        *field = &rest[..end];
        rest = &rest[end..];
    }
    let (start, end) = fields[0].split_once('-')?;
    let (start, end) = (
        u64::from_str_radix(start, 16).ok()?,
        u64::from_str_radix(end, 16).ok()?,
    );
    // A range that ends before it starts is no mapping.
    if end < start {
        return None;
    }
    Some(Mapping {
        start,
        end,
        perms: fields[1].to_string(),
        offset: u64::from_str_radix(fields[2], 16).ok()?,
        inode: fields[4].parse().ok()?,
        path: rest.trim_start_matches(' ').to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_files_pseudo_names_and_anonymous() {
        let text = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1234                       /usr/bin/my prog
7f0000000000-7f0000001000 rw-s 00000000 00:01 99                         /memfd:OTEL_CTX (deleted)
7f0000002000-7f0000003000 rw-p 00000000 00:00 0                          [anon:OTEL_CTX]
7f0000004000-7f0000005000 rw-p 00000000 00:00 0 
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]
garbage
7f0000009000-7f0000008000 rw-p 00000000 00:00 0 ends before it starts
";
        let maps = parse(text);
        assert_eq!(maps.len(), 5);
        assert_eq!(maps[0].path, "/usr/bin/my prog");
        assert_eq!(maps[0].inode, 1234);
        assert!(maps[0].is_file_backed());
        assert_eq!(maps[1].name(), "/memfd:OTEL_CTX");
        assert!(!maps[1].is_file_backed());
        assert_eq!(maps[1].perms, "rw-s");
        assert_eq!(maps[2].name(), "[anon:OTEL_CTX]");
        assert_eq!(maps[3].path, "");
        assert_eq!(maps[4].start, 0x7ffd00000000);
        assert_eq!(maps[4].len(), 0x2000);
    }
}
