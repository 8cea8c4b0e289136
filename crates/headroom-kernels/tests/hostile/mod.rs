//! Hand-made bundles, written byte by byte as an attacker would (bypassing every check
//! `tar::Builder` applies), and one hostile bundle of each kind `import` must refuse. Shared by
//! the library's tests and the CLI's, which include this file by path.

#![allow(dead_code)] // each including test uses a different part

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use headroom_kernels::bundle::BUNDLE_MANIFEST;
use headroom_kernels::cache::{hash_bytes, Entry, KeyRecord};
use headroom_kernels::resolve::Format;
use headroom_kernels::target::Backend;

/// The origin of every artifact here (any hash will do), as a literal for `concat!`.
macro_rules! origin {
    () => {
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
    };
}

/// The origin of every artifact here.
pub const ORIGIN: &str = origin!();

const BLOCK: usize = 512;

/// Decompressed bytes of zeros each repeated zstd frame of a bomb holds.
const ZERO_FRAME_BYTES: u64 = 1 << 20;
/// Gigabytes of zeros: what the decompression bombs claim and hold.
pub const BOMB_BYTES: u64 = 4 << 30;
/// Members in the million-entries bundle.
pub const MANY_ENTRIES: u64 = 1_000_000;

/// A piece of a bundle's decompressed tar stream.
pub enum Part {
    Tar(Vec<u8>),
    /// This many zero bytes, written as repeated zstd frames: the file stays small and is
    /// written without ever holding the zeros.
    Zeros(u64),
    /// This many empty regular members with distinct names, generated and compressed as they
    /// go; at most a million.
    EmptyMembers(u64),
}

/// One tar member: a header (preceded by a GNU long-name record when the name needs one) and
/// its data, padded to a block.
pub struct Member<'a> {
    pub name: &'a [u8],
    pub kind: tar::EntryType,
    pub link: &'a [u8],
    pub mode: u32,
    /// The size the header claims; `None` for the data's length.
    pub size: Option<u64>,
    pub data: &'a [u8],
}

pub fn regular<'a>(name: &'a [u8], data: &'a [u8]) -> Member<'a> {
    Member {
        name,
        kind: tar::EntryType::Regular,
        link: b"",
        mode: 0o644,
        size: None,
        data,
    }
}

fn padded(mut bytes: Vec<u8>) -> Vec<u8> {
    bytes.resize(bytes.len().div_ceil(BLOCK) * BLOCK, 0);
    bytes
}

fn raw_header(name: &[u8], kind: tar::EntryType, link: &[u8], mode: u32, size: u64) -> Vec<u8> {
    let mut header = tar::Header::new_gnu();
    let short = &name[..name.len().min(100)];
    header.as_old_mut().name[..short.len()].copy_from_slice(short);
    header.as_old_mut().linkname[..link.len()].copy_from_slice(link);
    header.set_entry_type(kind);
    header.set_size(size);
    header.set_mode(mode);
    header.set_cksum();
    header.as_bytes().to_vec()
}

impl Member<'_> {
    pub fn bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::new();
        if self.name.len() > 100 {
            let mut long = self.name.to_vec();
            long.push(0);
            bytes.extend(raw_header(
                b"././@LongLink",
                tar::EntryType::GNULongName,
                b"",
                0o644,
                long.len() as u64,
            ));
            bytes.extend(padded(long));
        }
        let size = self.size.unwrap_or(self.data.len() as u64);
        bytes.extend(raw_header(self.name, self.kind, self.link, self.mode, size));
        bytes.extend(padded(self.data.to_vec()));
        bytes
    }
}

/// Writes a bundle of these parts, each compressed as it comes, and the tar end marker.
pub fn write_bundle(path: &Path, parts: &[Part]) {
    let mut out = BufWriter::new(File::create(path).unwrap());
    let zero_frame = zstd::encode_all(&vec![0u8; ZERO_FRAME_BYTES as usize][..], 1).unwrap();
    for part in parts {
        match part {
            Part::Tar(bytes) => out
                .write_all(&zstd::encode_all(bytes.as_slice(), 1).unwrap())
                .unwrap(),
            Part::Zeros(bytes) => {
                for _ in 0..bytes / ZERO_FRAME_BYTES {
                    out.write_all(&zero_frame).unwrap();
                }
                let rest = vec![0u8; (bytes % ZERO_FRAME_BYTES) as usize];
                out.write_all(&zstd::encode_all(&rest[..], 1).unwrap())
                    .unwrap();
            }
            Part::EmptyMembers(count) => {
                // Member n is named `tiny/<n>-<999999 - n>`: every pair of digits sums to 9,
                // so every header has the same bytes but the name's, and the same checksum.
                // One header made by `tar::Header` then serves them all, where a million
                // `set_cksum` calls would take most of a debug build's test time.
                let mut header = raw_header(
                    format!("tiny/{:06}-{:06}", 0, 999_999).as_bytes(),
                    tar::EntryType::Regular,
                    b"",
                    0o644,
                    0,
                );
                let mut encoder = zstd::Encoder::new(&mut out, 1).unwrap();
                for n in 0..*count {
                    let name = format!("tiny/{n:06}-{:06}", 999_999 - n);
                    header[..name.len()].copy_from_slice(name.as_bytes());
                    encoder.write_all(&header).unwrap();
                }
                encoder.finish().unwrap();
            }
        }
    }
    out.write_all(&zstd::encode_all(&[0u8; 2 * BLOCK][..], 1).unwrap())
        .unwrap();
    out.into_inner().unwrap().sync_all().unwrap();
}

/// Writes a bundle of these members.
pub fn write_members(path: &Path, members: &[Member]) {
    write_bundle(
        path,
        &members
            .iter()
            .map(|member| Part::Tar(member.bytes()))
            .collect::<Vec<_>>(),
    );
}

/// One artifact as a bundle manifest lists it: kernel `kernel`, target sm_80, these bytes.
pub fn artifact(kernel: &str, bytes: &[u8]) -> serde_json::Value {
    let blob = hash_bytes(bytes);
    let entry = Entry {
        kernel: kernel.into(),
        backend: Backend::Cuda,
        origin: ORIGIN.into(),
        target: "sm_80".parse().unwrap(),
        key: hash_bytes(b"add"),
        record: KeyRecord {
            blob: blob.clone(),
            size: bytes.len() as u64,
            format: Format::Ptx,
            ptx_isa: None,
            toolchain: "clang 19".into(),
        },
    };
    serde_json::json!({
        "path": format!("cuda/{kernel}/{ORIGIN}/sm_80.ptx"),
        "blake3": blob,
        "size": bytes.len(),
        "entry": entry,
    })
}

pub fn manifest_of(artifacts: Vec<serde_json::Value>) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({ "schema": 2, "artifacts": artifacts })).unwrap()
}

/// A valid bundle manifest for one artifact `cuda/add/sm_80.ptx` with these bytes.
pub fn manifest_for(bytes: &[u8]) -> Vec<u8> {
    manifest_of(vec![artifact("add", bytes)])
}

/// The manifest member of `manifest_for(b"good")`; its artifact is `GOOD`.
pub fn good_manifest() -> Vec<u8> {
    regular(BUNDLE_MANIFEST.as_bytes(), &manifest_for(b"good")).bytes()
}

pub const GOOD: &[u8] = concat!("cuda/add/", origin!(), "/sm_80.ptx").as_bytes();

/// Every file, link and directory under `root`: relative path, kind and length.
pub fn listing(root: &Path) -> Vec<(String, String, u64)> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let metadata = std::fs::symlink_metadata(&path).unwrap();
            if metadata.is_dir() {
                pending.push(path.clone());
            }
            found.push((
                path.strip_prefix(root).unwrap().display().to_string(),
                format!("{:?}", metadata.file_type()),
                metadata.len(),
            ));
        }
    }
    found.sort();
    found
}

/// One kind of hostile bundle: its name, how to write it, and what the refusal must say.
pub struct Hostile {
    pub name: &'static str,
    pub write: fn(&Path),
    pub refusal: &'static str,
}

fn with_manifest(path: &Path, rest: Vec<Part>) {
    let mut parts = vec![Part::Tar(good_manifest())];
    parts.extend(rest);
    write_bundle(path, &parts);
}

fn with_good_member(path: &Path, member: Member) {
    write_bundle(
        path,
        &[Part::Tar(good_manifest()), Part::Tar(member.bytes())],
    );
}

fn typed(path: &Path, kind: tar::EntryType, link: &[u8]) {
    with_good_member(
        path,
        Member {
            kind,
            link,
            ..regular(GOOD, b"")
        },
    );
}

fn moded(path: &Path, mode: u32) {
    with_good_member(
        path,
        Member {
            mode,
            ..regular(GOOD, b"good")
        },
    );
}

fn named(path: &Path, name: &[u8]) {
    with_good_member(path, regular(name, b"good"));
}

/// Every kind of hostile bundle import must refuse.
pub const HOSTILE: &[Hostile] = &[
    Hostile {
        name: "decompression bomb: a member of 4 GiB of zeros the manifest declares as 4 bytes",
        write: |path| {
            let header = Member {
                size: Some(BOMB_BYTES),
                ..regular(GOOD, b"")
            };
            with_manifest(path, vec![Part::Tar(header.bytes()), Part::Zeros(BOMB_BYTES)]);
        },
        refusal: concat!("member `cuda/add/", origin!(), "/sm_80.ptx` is 4294967296 bytes but headroom-bundle.json declares 4"),
    },
    Hostile {
        name: "decompression bomb: 4 GiB of zeros in a long-name record",
        write: |path| {
            let header = raw_header(
                b"././@LongLink",
                tar::EntryType::GNULongName,
                b"",
                0o644,
                BOMB_BYTES,
            );
            with_manifest(path, vec![Part::Tar(header), Part::Zeros(BOMB_BYTES)]);
        },
        refusal: "the tar headers after member `headroom-bundle.json` run past 16384 bytes",
    },
    Hostile {
        name: "decompression bomb: a manifest of 4 GiB of zeros",
        write: |path| {
            let header = Member {
                size: Some(BOMB_BYTES),
                ..regular(BUNDLE_MANIFEST.as_bytes(), b"")
            };
            write_bundle(path, &[Part::Tar(header.bytes()), Part::Zeros(BOMB_BYTES)]);
        },
        refusal: "headroom-bundle.json is 4294967296 bytes, over the limit of 33554432",
    },
    Hostile {
        name: "a manifest declaring 32 GiB of artifacts",
        write: |path| {
            let mut artifacts = Vec::new();
            for kernel in ["a", "b"] {
                let mut artifact = artifact(kernel, b"");
                artifact["size"] = (16u64 << 30).into();
                artifact["entry"]["size"] = (16u64 << 30).into();
                artifacts.push(artifact);
            }
            let manifest = manifest_of(artifacts);
            write_members(path, &[regular(BUNDLE_MANIFEST.as_bytes(), &manifest)]);
        },
        refusal: concat!("declares more than 17179869184 bytes of artifacts (at `cuda/b/", origin!(), "/sm_80.ptx`)"),
    },
    Hostile {
        name: "a million tiny entries",
        write: |path| with_manifest(path, vec![Part::EmptyMembers(MANY_ENTRIES)]),
        refusal: "member `tiny/000000-999999` is not listed in headroom-bundle.json",
    },
    Hostile {
        name: "a manifest listing 20001 artifacts",
        write: |path| {
            // Made by text substitution: building 20001 `serde_json::Value`s is slow in a
            // debug build.
            let one = serde_json::to_string(&artifact("KERNEL", b"")).unwrap();
            let artifacts: Vec<String> = (0..20_001)
                .map(|n| one.replace("KERNEL", &format!("k{n}")))
                .collect();
            let manifest = format!(r#"{{"schema":2,"artifacts":[{}]}}"#, artifacts.join(","));
            write_members(path, &[regular(BUNDLE_MANIFEST.as_bytes(), manifest.as_bytes())]);
        },
        refusal: "lists 20001 artifacts, over the limit of 20000",
    },
    Hostile {
        name: "a name of 256 bytes",
        write: |path| named(path, format!("cuda/{}", "n".repeat(256)).as_bytes()),
        refusal: "has a 256-byte name, over the 255-byte limit",
    },
    Hostile {
        name: "a path of 4097 bytes",
        write: |path| named(path, "d/".repeat(2049).trim_end_matches('/').as_bytes()),
        refusal: "has a 4097-byte path, over the 4096-byte limit",
    },
    Hostile {
        name: "a name of 64 KiB, past what a header may hold",
        write: |path| named(path, "n".repeat(64 << 10).as_bytes()),
        refusal: "the tar headers after member `headroom-bundle.json` run past 16384 bytes",
    },
    Hostile {
        name: "a duplicate member",
        write: |path| {
            let member = regular(GOOD, b"good").bytes();
            with_manifest(path, vec![Part::Tar(member.clone()), Part::Tar(member)]);
        },
        refusal: concat!("member `cuda/add/", origin!(), "/sm_80.ptx` is duplicated"),
    },
    Hostile {
        name: "a duplicate manifest entry",
        write: |path| {
            let manifest = manifest_of(vec![artifact("add", b"good"), artifact("add", b"good")]);
            write_members(
                path,
                &[
                    regular(BUNDLE_MANIFEST.as_bytes(), &manifest),
                    regular(GOOD, b"good"),
                ],
            );
        },
        refusal: concat!("manifest entry `cuda/add/", origin!(), "/sm_80.ptx` is listed twice"),
    },
    Hostile {
        name: "a hard link",
        write: |path| typed(path, tar::EntryType::Link, b"/etc/passwd"),
        refusal: concat!("member `cuda/add/", origin!(), "/sm_80.ptx` is a Link, only regular files are allowed"),
    },
    Hostile {
        name: "a symlink",
        write: |path| typed(path, tar::EntryType::Symlink, b"/etc/passwd"),
        refusal: concat!("member `cuda/add/", origin!(), "/sm_80.ptx` is a Symlink, only regular files are allowed"),
    },
    Hostile {
        name: "a character device",
        write: |path| typed(path, tar::EntryType::Char, b""),
        refusal: concat!("member `cuda/add/", origin!(), "/sm_80.ptx` is a Char, only regular files are allowed"),
    },
    Hostile {
        name: "a block device",
        write: |path| typed(path, tar::EntryType::Block, b""),
        refusal: concat!("member `cuda/add/", origin!(), "/sm_80.ptx` is a Block, only regular files are allowed"),
    },
    Hostile {
        name: "a FIFO",
        write: |path| typed(path, tar::EntryType::Fifo, b""),
        refusal: concat!("member `cuda/add/", origin!(), "/sm_80.ptx` is a Fifo, only regular files are allowed"),
    },
    Hostile {
        name: "a setuid member",
        write: |path| moded(path, 0o4755),
        refusal: concat!("member `cuda/add/", origin!(), "/sm_80.ptx` has mode 4755; setuid, setgid, sticky and world-writable modes are refused"),
    },
    Hostile {
        name: "a setgid member",
        write: |path| moded(path, 0o2755),
        refusal: "has mode 2755",
    },
    Hostile {
        name: "a sticky member",
        write: |path| moded(path, 0o1644),
        refusal: "has mode 1644",
    },
    Hostile {
        name: "a world-writable member",
        write: |path| moded(path, 0o666),
        refusal: "has mode 666",
    },
    Hostile {
        name: "a world-writable manifest",
        write: |path| {
            let manifest = manifest_for(b"good");
            let member = Member {
                mode: 0o646,
                ..regular(BUNDLE_MANIFEST.as_bytes(), &manifest)
            };
            write_members(path, &[member, regular(GOOD, b"good")]);
        },
        refusal: "member `headroom-bundle.json` has mode 646",
    },
    Hostile {
        name: "a manifest that declares fewer bytes than the member holds",
        write: |path| with_good_member(path, regular(GOOD, b"good and more")),
        refusal: concat!("member `cuda/add/", origin!(), "/sm_80.ptx` is 13 bytes but headroom-bundle.json declares 4"),
    },
    Hostile {
        name: "a manifest whose size and record disagree",
        write: |path| {
            let mut artifact = artifact("add", b"good");
            artifact["entry"]["size"] = 5.into();
            let manifest = manifest_of(vec![artifact]);
            write_members(
                path,
                &[
                    regular(BUNDLE_MANIFEST.as_bytes(), &manifest),
                    regular(GOOD, b"good"),
                ],
            );
        },
        refusal: concat!("manifest entry `cuda/add/", origin!(), "/sm_80.ptx` declares 4 bytes but its record 5"),
    },
    Hostile {
        name: "a member cut short of the size its header and the manifest give",
        write: |path| {
            let header = Member {
                size: Some(4),
                ..regular(GOOD, b"")
            };
            let mut bytes = good_manifest();
            bytes.extend(header.bytes());
            bytes.extend(b"go");
            std::fs::write(path, zstd::encode_all(bytes.as_slice(), 1).unwrap()).unwrap();
        },
        refusal: concat!("member `cuda/add/", origin!(), "/sm_80.ptx` is cut short at 2 of its 4 bytes"),
    },
    Hostile {
        name: "bytes that do not match the manifest's hash",
        write: |path| with_good_member(path, regular(GOOD, b"evil")),
        refusal: concat!("member `cuda/add/", origin!(), "/sm_80.ptx` does not match its blake3 hash"),
    },
    Hostile {
        name: "a member the manifest does not list",
        write: |path| with_good_member(path, regular(concat!("cuda/add/", origin!(), "/sm_90.ptx").as_bytes(), b"good")),
        refusal: concat!("member `cuda/add/", origin!(), "/sm_90.ptx` is not listed in headroom-bundle.json"),
    },
];
