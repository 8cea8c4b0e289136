//! Build targets (`sm_90a`, `compute_80`, `gfx90a:xnack-`, `gfx11-generic`, `apple9`, `metal3.1`):
//! one parser and one printer shared by the manifest, the cache layout, the bundle and the
//! resolver, so a target means the same thing everywhere.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The GPU vendor family an artifact is built for; also the first directory of the cache layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Cuda,
    Hip,
    Metal,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Cuda => "cuda",
            Backend::Hip => "hip",
            Backend::Metal => "metal",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An NVIDIA compute capability, `major.minor` (8.9 for `sm_89`, 10.0 for `sm_100`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ComputeCapability {
    pub major: u8,
    pub minor: u8,
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The variant suffix of a CUDA architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CudaVariant {
    /// `sm_90`: runs on the same major with an equal or higher minor.
    Portable,
    /// `sm_90a`: architecture-specific, runs on exactly that compute capability.
    ArchSpecific,
    /// `sm_100f`: family-specific, runs on the same family (same major, equal or higher minor).
    FamilySpecific,
}

impl CudaVariant {
    fn suffix(self) -> &'static str {
        match self {
            CudaVariant::Portable => "",
            CudaVariant::ArchSpecific => "a",
            CudaVariant::FamilySpecific => "f",
        }
    }
}

/// How an AMD target ID fixes one feature (`xnack`, `sramecc`): unspecified means "any".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum FeatureSetting {
    #[default]
    Any,
    On,
    Off,
}

/// Apple GPU targets: a minimum GPU family or a Metal language version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AppleTarget {
    /// `apple7` (M1), `apple8` (M2), `apple9` (M3, M4): built for that GPU family and newer.
    Family(u8),
    /// `metal3.1`: built with `-std=metal3.1`, runs on any Metal 3 GPU (Apple7 and newer).
    MetalVersion { major: u8, minor: u8 },
}

/// One build target of a kernel.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    /// `sm_XX`, `sm_XXa`, `sm_XXXf`: machine code (cubin) for a compute capability.
    CudaSm {
        cc: ComputeCapability,
        variant: CudaVariant,
    },
    /// `compute_XX` (or `compute_XXa`): PTX that the driver JIT-compiles.
    CudaPtx {
        cc: ComputeCapability,
        variant: CudaVariant,
    },
    /// `gfx90a`, `gfx942:sramecc+:xnack-`: a processor with optional feature settings.
    Amd {
        processor: String,
        xnack: FeatureSetting,
        sramecc: FeatureSetting,
    },
    /// `gfx11-generic`: code that runs on every member processor of the generic target.
    AmdGeneric {
        name: String,
    },
    Apple(AppleTarget),
}

/// Why a target string was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown target `{input}`: {reason}; valid forms are sm_XX, sm_XXa, sm_XXXf, compute_XX, gfxNNN[:xnack±][:sramecc±], gfxN-generic, appleN, metalX.Y")]
pub struct TargetError {
    pub input: String,
    pub reason: String,
}

/// AMD generic targets and their member processors (LLVM AMDGPUUsage, "Generic processors").
pub const AMD_GENERIC_TARGETS: &[(&str, &[&str])] = &[
    (
        "gfx9-generic",
        &["gfx900", "gfx902", "gfx904", "gfx906", "gfx909", "gfx90c"],
    ),
    ("gfx9-4-generic", &["gfx940", "gfx941", "gfx942", "gfx950"]),
    (
        "gfx10-1-generic",
        &["gfx1010", "gfx1011", "gfx1012", "gfx1013"],
    ),
    (
        "gfx10-3-generic",
        &[
            "gfx1030", "gfx1031", "gfx1032", "gfx1033", "gfx1034", "gfx1035", "gfx1036",
        ],
    ),
    (
        "gfx11-generic",
        &[
            "gfx1100", "gfx1101", "gfx1102", "gfx1103", "gfx1150", "gfx1151", "gfx1152", "gfx1153",
        ],
    ),
    ("gfx12-generic", &["gfx1200", "gfx1201"]),
];

/// The member processors of a generic AMD target, or `None` when the name is not generic.
pub fn amd_generic_members(name: &str) -> Option<&'static [&'static str]> {
    AMD_GENERIC_TARGETS
        .iter()
        .find(|(generic, _)| *generic == name)
        .map(|(_, members)| *members)
}

impl Target {
    pub fn backend(&self) -> Backend {
        match self {
            Target::CudaSm { .. } | Target::CudaPtx { .. } => Backend::Cuda,
            Target::Amd { .. } | Target::AmdGeneric { .. } => Backend::Hip,
            Target::Apple(_) => Backend::Metal,
        }
    }

    /// The target as a file name stem: `:` (not portable in file names) becomes `_`.
    pub fn file_stem(&self) -> String {
        self.to_string().replace(':', "_")
    }
}

fn error(input: &str, reason: impl Into<String>) -> TargetError {
    TargetError {
        input: input.to_string(),
        reason: reason.into(),
    }
}

/// Parses the `XX`, `90a`, `100f` part of `sm_XX`: the last digit is the minor version.
fn parse_cuda_arch(
    input: &str,
    digits_and_suffix: &str,
) -> Result<(ComputeCapability, CudaVariant), TargetError> {
    let (digits, variant) = match digits_and_suffix.as_bytes().last() {
        Some(b'a') => (
            &digits_and_suffix[..digits_and_suffix.len() - 1],
            CudaVariant::ArchSpecific,
        ),
        Some(b'f') => (
            &digits_and_suffix[..digits_and_suffix.len() - 1],
            CudaVariant::FamilySpecific,
        ),
        _ => (digits_and_suffix, CudaVariant::Portable),
    };
    if !(2..=3).contains(&digits.len()) || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(error(input, "a CUDA architecture is 2 or 3 digits (major then minor), optionally followed by `a` or `f`"));
    }
    let (major, minor) = digits.split_at(digits.len() - 1);
    let major: u8 = major
        .parse()
        .map_err(|_| error(input, "the major version is malformed"))?;
    let minor: u8 = minor
        .parse()
        .map_err(|_| error(input, "the minor version is malformed"))?;
    if major < 3 {
        return Err(error(input, "CUDA architectures start at sm_30"));
    }
    Ok((ComputeCapability { major, minor }, variant))
}

fn parse_feature(
    input: &str,
    feature: &str,
) -> Result<(&'static str, FeatureSetting), TargetError> {
    let (name, setting) = match feature.as_bytes().last() {
        Some(b'+') => (&feature[..feature.len() - 1], FeatureSetting::On),
        Some(b'-') => (&feature[..feature.len() - 1], FeatureSetting::Off),
        _ => {
            return Err(error(
                input,
                format!("feature `{feature}` must end in `+` or `-`"),
            ))
        }
    };
    match name {
        "xnack" => Ok(("xnack", setting)),
        "sramecc" => Ok(("sramecc", setting)),
        _ => Err(error(
            input,
            format!("unknown AMD target feature `{name}` (known: xnack, sramecc)"),
        )),
    }
}

fn parse_amd(input: &str) -> Result<Target, TargetError> {
    let mut parts = input.split(':');
    let processor = parts.next().unwrap_or_default();
    if amd_generic_members(processor).is_some() {
        if parts.next().is_some() {
            return Err(error(input, "generic AMD targets take no feature settings"));
        }
        return Ok(Target::AmdGeneric {
            name: processor.to_string(),
        });
    }
    let model = &processor[3..];
    if !(3..=4).contains(&model.len())
        || !model.bytes().all(|b| b.is_ascii_hexdigit())
        || !model.starts_with(|c: char| c.is_ascii_digit())
    {
        return Err(error(
            input,
            "an AMD processor is `gfx` followed by 3 or 4 hex digits, e.g. gfx90a or gfx1100",
        ));
    }
    let (mut xnack, mut sramecc) = (None, None);
    for feature in parts {
        let slot = match parse_feature(input, feature)? {
            ("xnack", setting) => (&mut xnack, setting),
            (_, setting) => (&mut sramecc, setting),
        };
        if slot.0.replace(slot.1).is_some() {
            return Err(error(
                input,
                format!("feature in `{feature}` is given twice"),
            ));
        }
    }
    Ok(Target::Amd {
        processor: processor.to_string(),
        xnack: xnack.unwrap_or_default(),
        sramecc: sramecc.unwrap_or_default(),
    })
}

fn parse_apple(input: &str) -> Result<Target, TargetError> {
    if let Some(family) = input.strip_prefix("apple") {
        let family: u8 = family
            .parse()
            .map_err(|_| error(input, "an Apple GPU family is `appleN`, e.g. apple9"))?;
        if !(1..=10).contains(&family) {
            return Err(error(input, "Apple GPU families are apple1 to apple10"));
        }
        return Ok(Target::Apple(AppleTarget::Family(family)));
    }
    let version = input.strip_prefix("metal").unwrap_or_default();
    let (major, minor) = version
        .split_once('.')
        .and_then(|(major, minor)| Some((major.parse::<u8>().ok()?, minor.parse::<u8>().ok()?)))
        .ok_or_else(|| {
            error(
                input,
                "a Metal language version is `metalX.Y`, e.g. metal3.1",
            )
        })?;
    if !(1..=4).contains(&major) {
        return Err(error(
            input,
            "Metal language versions run from metal1.0 to metal4.x",
        ));
    }
    Ok(Target::Apple(AppleTarget::MetalVersion { major, minor }))
}

impl FromStr for Target {
    type Err = TargetError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        if let Some(arch) = input.strip_prefix("sm_") {
            let (cc, variant) = parse_cuda_arch(input, arch)?;
            Ok(Target::CudaSm { cc, variant })
        } else if let Some(arch) = input.strip_prefix("compute_") {
            let (cc, variant) = parse_cuda_arch(input, arch)?;
            if variant == CudaVariant::FamilySpecific {
                return Err(error(
                    input,
                    "family-specific PTX is not a thing; use sm_XXXf or compute_XXX",
                ));
            }
            Ok(Target::CudaPtx { cc, variant })
        } else if input.starts_with("gfx") {
            parse_amd(input)
        } else if input.starts_with("apple") || input.starts_with("metal") {
            parse_apple(input)
        } else {
            Err(error(input, "it names no known backend"))
        }
    }
}

fn write_cuda(
    f: &mut fmt::Formatter<'_>,
    prefix: &str,
    cc: ComputeCapability,
    variant: CudaVariant,
) -> fmt::Result {
    write!(f, "{prefix}{}{}{}", cc.major, cc.minor, variant.suffix())
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::CudaSm { cc, variant } => write_cuda(f, "sm_", *cc, *variant),
            Target::CudaPtx { cc, variant } => write_cuda(f, "compute_", *cc, *variant),
            Target::Amd {
                processor,
                xnack,
                sramecc,
            } => {
                f.write_str(processor)?;
                // LLVM's canonical order: sramecc before xnack.
                for (name, setting) in [("sramecc", sramecc), ("xnack", xnack)] {
                    match setting {
                        FeatureSetting::Any => {}
                        FeatureSetting::On => write!(f, ":{name}+")?,
                        FeatureSetting::Off => write!(f, ":{name}-")?,
                    }
                }
                Ok(())
            }
            Target::AmdGeneric { name } => f.write_str(name),
            Target::Apple(AppleTarget::Family(family)) => write!(f, "apple{family}"),
            Target::Apple(AppleTarget::MetalVersion { major, minor }) => {
                write!(f, "metal{major}.{minor}")
            }
        }
    }
}

impl Serialize for Target {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Target {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_every_target_form_the_issue_names() {
        for text in [
            "sm_75",
            "sm_80",
            "sm_86",
            "sm_87",
            "sm_89",
            "sm_90",
            "sm_90a",
            "sm_100f",
            "sm_120",
            "compute_90",
            "compute_90a",
            "gfx1030",
            "gfx1100",
            "gfx1101",
            "gfx1102",
            "gfx90a",
            "gfx942",
            "gfx90a:xnack-",
            "gfx942:sramecc+:xnack-",
            "gfx11-generic",
            "apple9",
            "metal3.1",
        ] {
            let target: Target = text.parse().unwrap_or_else(|err| panic!("{text}: {err}"));
            assert_eq!(target.to_string(), text);
        }
    }

    #[test]
    fn features_print_in_canonical_order() {
        let target: Target = "gfx942:xnack-:sramecc+".parse().unwrap();
        assert_eq!(target.to_string(), "gfx942:sramecc+:xnack-");
        assert_eq!(target.file_stem(), "gfx942_sramecc+_xnack-");
    }

    #[test]
    fn rejects_malformed_targets_with_a_reason() {
        for text in [
            "sm_9",
            "sm_abc",
            "compute_100f",
            "gfx90a:xnack",
            "gfx90a:foo+",
            "gfx11-generic:xnack-",
            "gfxzz",
            "apple",
            "metal3",
            "vulkan",
        ] {
            let err = text.parse::<Target>().unwrap_err();
            assert_eq!(err.input, text);
            assert!(err.to_string().contains("valid forms"), "{err}");
        }
    }

    #[test]
    fn backends_follow_the_target_family() {
        assert_eq!("sm_80".parse::<Target>().unwrap().backend(), Backend::Cuda);
        assert_eq!(
            "gfx11-generic".parse::<Target>().unwrap().backend(),
            Backend::Hip
        );
        assert_eq!(
            "metal3.0".parse::<Target>().unwrap().backend(),
            Backend::Metal
        );
    }

    proptest! {
        #[test]
        fn cuda_targets_round_trip(major in 3u8..=13, minor in 0u8..=9, suffix in prop::sample::select(vec!["", "a", "f"])) {
            let text = format!("sm_{major}{minor}{suffix}");
            let target: Target = text.parse().unwrap();
            prop_assert_eq!(target.to_string(), text);
        }

        #[test]
        fn amd_targets_round_trip(model in "[0-9][0-9a-f]{2,3}", xnack in 0usize..3, sramecc in 0usize..3) {
            let settings = ["", "+", "-"];
            let mut text = format!("gfx{model}");
            if sramecc > 0 { text.push_str(&format!(":sramecc{}", settings[sramecc])); }
            if xnack > 0 { text.push_str(&format!(":xnack{}", settings[xnack])); }
            let target: Target = text.parse().unwrap();
            prop_assert_eq!(target.to_string(), text);
        }
    }
}
