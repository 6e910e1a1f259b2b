//! The initramfs archive: the kernel's "newc" cpio format (`Documentation/driver-api/
//! early-userspace/buffer-format.rst`), written here so that building a guest needs no `cpio`
//! program and no root (device nodes are entries, not `mknod` calls). Uncompressed: the kernel
//! unpacks it as is.

/// One archive member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A directory.
    Dir { path: String, mode: u32 },
    /// A regular file with its contents.
    File {
        path: String,
        mode: u32,
        data: Vec<u8>,
    },
    /// A symbolic link to `target`.
    Symlink { path: String, target: String },
    /// A character device `major:minor`.
    CharDev {
        path: String,
        mode: u32,
        major: u32,
        minor: u32,
    },
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;

/// The archive of `entries` (in order, parents before children), ending with the trailer.
/// Owned by root; every timestamp 0, so equal inputs give equal bytes.
pub fn archive(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::new();
    for (ino, e) in (1u32..).zip(entries) {
        let (path, mode, data, dev): (&str, u32, &[u8], (u32, u32)) = match e {
            Entry::Dir { path, mode } => (path, S_IFDIR | mode, &[], (0, 0)),
            Entry::File { path, mode, data } => (path, S_IFREG | mode, data, (0, 0)),
            Entry::Symlink { path, target } => (path, S_IFLNK | 0o777, target.as_bytes(), (0, 0)),
            Entry::CharDev {
                path,
                mode,
                major,
                minor,
            } => (path, S_IFCHR | mode, &[], (*major, *minor)),
        };
        let nlink = if matches!(e, Entry::Dir { .. }) { 2 } else { 1 };
        member(&mut out, ino, path, mode, nlink, data, dev);
    }
    member(&mut out, 0, "TRAILER!!!", 0, 1, &[], (0, 0));
    out
}

/// One header, name and data, each padded to 4 bytes.
fn member(
    out: &mut Vec<u8>,
    ino: u32,
    path: &str,
    mode: u32,
    nlink: u32,
    data: &[u8],
    dev: (u32, u32),
) {
    let name_len = path.len() + 1;
    let fields = [
        ino,
        mode,
        0, // uid
        0, // gid
        nlink,
        0, // mtime
        data.len() as u32,
        0, // devmajor
        0, // devminor
        dev.0,
        dev.1,
        name_len as u32,
        0, // check
    ];
    out.extend_from_slice(b"070701");
    for f in fields {
        out.extend_from_slice(format!("{f:08x}").as_bytes());
    }
    out.extend_from_slice(path.as_bytes());
    out.push(0);
    pad4(out);
    out.extend_from_slice(data);
    pad4(out);
}

fn pad4(out: &mut Vec<u8>) {
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member read back: name, mode, data, device numbers.
    type Member = (String, u32, Vec<u8>, (u32, u32));

    /// Parse a newc archive back into its members.
    fn parse(mut b: &[u8]) -> Vec<Member> {
        let mut out = Vec::new();
        let total = b.len();
        loop {
            assert_eq!(&b[..6], b"070701");
            let field = |i: usize| {
                u32::from_str_radix(std::str::from_utf8(&b[6 + 8 * i..14 + 8 * i]).unwrap(), 16)
                    .unwrap()
            };
            let (mode, size, rmaj, rmin, namesize) =
                (field(1), field(6), field(9), field(10), field(11));
            let name_end = 110 + namesize as usize;
            let name = String::from_utf8(b[110..name_end - 1].to_vec()).unwrap();
            let data_start = name_end.next_multiple_of(4);
            let data_end = data_start + size as usize;
            let data = b[data_start..data_end].to_vec();
            b = &b[data_end.next_multiple_of(4)..];
            assert_eq!((total - b.len()) % 4, 0);
            if name == "TRAILER!!!" {
                assert!(b.is_empty());
                return out;
            }
            out.push((name, mode, data, (rmaj, rmin)));
        }
    }

    #[test]
    fn round_trips_every_kind_with_padding() {
        let entries = [
            Entry::Dir {
                path: "dev".into(),
                mode: 0o755,
            },
            Entry::CharDev {
                path: "dev/console".into(),
                mode: 0o600,
                major: 5,
                minor: 1,
            },
            Entry::File {
                path: "init".into(),
                mode: 0o755,
                data: b"#!/bin/sh\n".to_vec(),
            },
            Entry::Symlink {
                path: "sbin".into(),
                target: "bin".into(),
            },
        ];
        let a = archive(&entries);
        assert_eq!(a.len() % 4, 0);
        let p = parse(&a);
        assert_eq!(p.len(), 4);
        assert_eq!(p[0], ("dev".into(), S_IFDIR | 0o755, vec![], (0, 0)));
        assert_eq!(
            p[1],
            ("dev/console".into(), S_IFCHR | 0o600, vec![], (5, 1))
        );
        assert_eq!(
            p[2],
            (
                "init".into(),
                S_IFREG | 0o755,
                b"#!/bin/sh\n".to_vec(),
                (0, 0)
            )
        );
        assert_eq!(
            p[3],
            ("sbin".into(), S_IFLNK | 0o777, b"bin".to_vec(), (0, 0))
        );
        assert_eq!(archive(&entries), a, "deterministic");
    }
}
