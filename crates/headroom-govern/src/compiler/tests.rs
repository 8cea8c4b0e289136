//! The families' names and answers, the interceptor's table against them, and a made-up
//! family (`example.rs`) that every question reaches.

use std::ffi::{c_char, c_int, OsString};
use std::path::{Path, PathBuf};

use headroom_farm::{Distcc, Engine, SccacheDist};

use super::*;

extern "C" {
    fn headroom_is_compiler_name(name: *const c_char, len: usize) -> c_int;
}

/// The interceptor's rule, from its C code.
fn c_governs(name: &str) -> bool {
    // SAFETY: the C function reads exactly `len` bytes of `name` and keeps no pointer.
    unsafe { headroom_is_compiler_name(name.as_ptr().cast(), name.len()) != 0 }
}

fn args(text: &str) -> Vec<String> {
    text.split_whitespace().map(String::from).collect()
}

fn os_args(text: &str) -> Vec<OsString> {
    text.split_whitespace().map(OsString::from).collect()
}

fn engines() -> [Engine; 2] {
    [
        Engine::Distcc(Distcc {
            client: PathBuf::from("/usr/bin/distcc"),
        }),
        Engine::SccacheDist(SccacheDist {
            client: PathBuf::from("/usr/bin/sccache"),
            token: String::new(),
        }),
    ]
}

/// Whether `engine` would send `call` of `compiler` to a node, as the governor asks it.
fn farmed(engine: &Engine, compiler: &str, call: &str) -> bool {
    let farming = family_of(compiler).and_then(|family| family.farming.as_ref());
    engine.would_distribute(farming, &args(call))
}

/// Names the interceptor governs, and names it leaves alone.
const GOVERNED: [&str; 17] = [
    "gcc",
    "g++-12",
    "clang++-19",
    "x86_64-linux-gnu-g++-12",
    "cc",
    "c++",
    "aarch64-linux-gnu-gcc",
    "nvcc",
    "hipcc",
    "rustc",
    "ld",
    "ld.gold",
    "ld.lld",
    "x86_64-linux-gnu-ld.bfd",
    "mold",
    "ptxas",
    "neuronx-cc",
];
const NOT_GOVERNED: [&str; 17] = [
    "c++filt",
    "clang-tidy",
    "gcc-ar",
    "ccache",
    "gccgo",
    "g++-wrapper",
    "lcc",
    "make",
    "ninja",
    "ldd",
    "ld.so",
    "ld.gold-2",
    "cicc",
    "cc1plus",
    "true",
    "x86_64-linux-gnu-gcc-ar-12",
    "",
];

#[test]
fn the_interceptor_and_the_families_govern_the_same_names() {
    for name in GOVERNED {
        assert!(c_governs(name), "the interceptor governs {name}");
        assert!(is_governed(name), "the families govern {name}");
    }
    for name in NOT_GOVERNED {
        assert!(!c_governs(name), "the interceptor leaves {name} alone");
        assert!(!is_governed(name), "the families leave {name} alone");
    }
}

/// The string literals of the C array `array` in `source`.
fn c_array(source: &str, array: &str) -> Vec<String> {
    let start = source
        .find(&format!("{array}[] = {{"))
        .unwrap_or_else(|| panic!("compiler_names.c defines {array}"));
    let body = &source[start..];
    let body = &body[..body.find("};").expect("the array ends")];
    let without_comments: String = body
        .split("/*")
        .enumerate()
        .map(|(i, part)| {
            if i == 0 {
                part
            } else {
                part.split_once("*/").map_or("", |(_, rest)| rest)
            }
        })
        .collect();
    without_comments
        .split('"')
        .skip(1)
        .step_by(2)
        .map(String::from)
        .collect()
}

#[test]
fn the_interceptors_table_names_exactly_the_families_programs() {
    let source = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("intercept/compiler_names.c"),
    )
    .expect("intercept/compiler_names.c is readable");
    let real = || FAMILIES.iter().filter(|f| f.name != example::FAMILY.name);
    let sorted = |mut names: Vec<String>| {
        names.sort();
        names
    };
    let programs: Vec<String> = real()
        .flat_map(|f| f.programs.iter().map(|p| p.to_string()))
        .collect();
    let fixed: Vec<String> = real()
        .flat_map(|f| f.programs_without_version.iter().map(|p| p.to_string()))
        .collect();
    assert_eq!(
        sorted(c_array(&source, "PROGRAMS")),
        sorted(programs),
        "compiler_names.c's PROGRAMS must list every family's `programs` (src/compiler/)"
    );
    assert_eq!(
        sorted(c_array(&source, "PROGRAMS_WITHOUT_VERSION")),
        sorted(fixed),
        "compiler_names.c's PROGRAMS_WITHOUT_VERSION must list every family's \
         `programs_without_version` (src/compiler/)"
    );
}

#[test]
fn target_prefixed_and_versioned_gcc_and_clang_get_the_ladder_and_the_farm() {
    for name in [
        "g++",
        "/usr/bin/x86_64-linux-gnu-g++-12",
        "aarch64-linux-gnu-gcc",
        "clang++-19",
        "arm-none-eabi-gcc-13.2",
    ] {
        let family = family_of(name).unwrap_or_else(|| panic!("{name} has a family"));
        assert_eq!(family.name, "gcc/clang", "{name}");
        assert_eq!(
            family.ladder,
            Ladder::GccFlags,
            "{name} takes the flag ladder"
        );
        for engine in engines() {
            assert!(
                farmed(&engine, name, "-O2 -c a.cpp -o a.o"),
                "{name} through {:?}",
                engine.kind()
            );
        }
    }
}

#[test]
fn names_with_another_prefix_are_governed_but_of_no_family() {
    for name in ["neuronx-cc", "my-g++", "avr-gcc"] {
        assert!(is_governed(name), "{name}");
        assert!(family_of(name).is_none(), "{name}");
        for engine in engines() {
            assert!(!farmed(&engine, name, "-c a.cpp"), "{name}");
        }
    }
    for name in [
        "nvcc",
        "rustc",
        "gccgo",
        "clang-tidy",
        "g++-wrapper",
        "c++filt",
    ] {
        assert!(
            !family_of(name).is_some_and(|f| f.ladder == Ladder::GccFlags),
            "{name} takes no gcc flags"
        );
    }
}

#[test]
fn each_engine_farms_the_families_it_carries() {
    let [distcc, sccache] = engines();
    assert!(farmed(&sccache, "nvcc", "-c k.cu -o k.o"));
    assert!(!farmed(&distcc, "nvcc", "-c k.cu -o k.o"));
    assert!(!farmed(&sccache, "g++", "-c k.cu"));
    for (compiler, call) in [
        ("ld", "-c a.cpp"),
        ("rustc", "--crate-name a -c a.rs"),
        ("hipcc", "-c k.hip"),
        ("ptxas", "-c k.ptx"),
    ] {
        for engine in [&distcc, &sccache] {
            assert!(!farmed(engine, compiler, call), "{compiler}");
        }
    }
}

#[test]
fn inner_tools_are_compiler_like_and_the_build_system_is_not() {
    for name in [
        "cc1plus", "cicc", "cudafe++", "ptxas", "g++", "clang-19", "ld.gold", "nvcc", "collect2",
    ] {
        assert!(is_compiler_like(name), "{name}");
    }
    for name in ["make", "ninja", "sh", "python3", "cmake", "headroom-shim"] {
        assert!(!is_compiler_like(name), "{name}");
    }
}

#[test]
fn rustc_and_gcc_read_their_response_files_each_their_way() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.rsp"), "--cfg\nfeature=\"std\"\n").unwrap();
    let call = args("@a.rsp src/lib.rs");
    assert_eq!(
        expand_response_files("rustc", &call, dir.path()),
        ["--cfg", "feature=\"std\"", "src/lib.rs"]
    );
    assert_eq!(
        expand_response_files("/usr/bin/g++-12", &call, dir.path()),
        ["--cfg", "feature=std", "src/lib.rs"]
    );
    assert_eq!(
        expand_response_files("some-tool", &call, dir.path()),
        ["--cfg", "feature=std", "src/lib.rs"],
        "a compiler of no family is read as libiberty reads it"
    );
}

#[test]
fn a_family_in_one_file_answers_every_question() {
    // Its names, with a target prefix and a version, and its fixed name.
    for name in [
        "examplecc",
        "/opt/x/bin/x86_64-linux-gnu-examplecc-3.1",
        "examplecc.fast",
    ] {
        assert_eq!(family_of(name).map(|f| f.name), Some("example"), "{name}");
        let file_name = Path::new(name).file_name().unwrap().to_str().unwrap();
        assert!(is_governed(file_name), "{name}");
    }
    assert!(family_of("examplecc.fast-3").is_none());
    // Its probes, by its own rule.
    assert!(is_probe("examplecc", &os_args("--which")));
    assert!(!is_probe("examplecc", &os_args("--version")));
    assert!(is_probe("g++", &os_args("--version")));
    // Its flags: the ladder applies.
    assert_eq!(family_of("examplecc").unwrap().ladder, Ladder::GccFlags);
    // Its response files, one argument per line.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.rsp"), "-O 2\n").unwrap();
    assert_eq!(
        expand_response_files("examplecc", &args("@a.rsp a.ex"), dir.path()),
        ["-O 2", "a.ex"]
    );
    // Its farming: every engine carries one of its sources.
    for engine in engines() {
        assert!(farmed(&engine, "examplecc", "-c a.ex -o a.o"));
        assert!(!farmed(&engine, "examplecc", "-c a.cpp -o a.o"));
    }
    // Its inner tools.
    assert!(is_compiler_like("example-backend"));
}
