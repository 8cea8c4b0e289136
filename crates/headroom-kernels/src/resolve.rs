//! The runtime resolver: given the device a process runs on and the artifacts a kernel was
//! built into, pick the one to load, by the vendors' published compatibility rules.
//!
//! Hand-written selectors get this wrong (an sm_90 cubin on Blackwell, sm_86 PTX on an 8.0
//! device, gfx90a code on every gfx90*, gfx1100 code on every gfx110*). Here every candidate
//! gets a [`Verdict`] from one function, [`evaluate`]; [`resolve`] keeps the best and
//! [`explain`] keeps them all. Neither allocates per candidate, so resolving stays well under
//! a microsecond.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::target::Backend;
use crate::target::{
    amd_generic_members, AppleTarget, ComputeCapability, CudaVariant, FeatureSetting, Target,
};

/// What kind of file an artifact is; decides how it loads and whether it needs a JIT step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// NVIDIA machine code for one architecture.
    Cubin,
    /// NVIDIA virtual ISA, compiled by the driver's JIT at load time.
    Ptx,
    /// An nvcc fat binary: a cubin plus PTX of the same architecture.
    Fatbin,
    /// An AMDGPU ELF code object (hsaco).
    CodeObject,
    /// A Metal library.
    Metallib,
}

impl Format {
    pub fn extension(self) -> &'static str {
        match self {
            Format::Cubin => "cubin",
            Format::Ptx => "ptx",
            Format::Fatbin => "fatbin",
            Format::CodeObject => "hsaco",
            Format::Metallib => "metallib",
        }
    }
}

/// A PTX ISA version (`.version 8.4` in a PTX file), compared numerically.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PtxIsa {
    pub major: u8,
    pub minor: u8,
}

impl fmt::Display for PtxIsa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Why a PTX ISA version (`--driver-ptx`) was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid PTX ISA version `{0}`: write it as MAJOR.MINOR, e.g. 8.4")]
pub struct PtxIsaError(pub String);

impl FromStr for PtxIsa {
    type Err = PtxIsaError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        input
            .split_once('.')
            .and_then(|(major, minor)| {
                Some(PtxIsa {
                    major: major.parse().ok()?,
                    minor: minor.parse().ok()?,
                })
            })
            .ok_or_else(|| PtxIsaError(input.to_string()))
    }
}

impl Serialize for PtxIsa {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PtxIsa {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// The GPU a process runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Device {
    Cuda(ComputeCapability),
    /// An AMD processor; a feature the caller did not state is unknown, not "any".
    Amd {
        processor: String,
        xnack: FeatureSetting,
        sramecc: FeatureSetting,
    },
    /// An Apple GPU family (M1 is Apple7, M2 Apple8, M3 and M4 Apple9).
    Apple {
        family: u8,
    },
}

impl Device {
    pub fn backend(&self) -> Backend {
        match self {
            Device::Cuda(_) => Backend::Cuda,
            Device::Amd { .. } => Backend::Hip,
            Device::Apple { .. } => Backend::Metal,
        }
    }
}

/// The device as `--device` names it: `sm_90`, `gfx90a:xnack-`, `apple9`.
impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = match self {
            Device::Cuda(cc) => Target::CudaSm {
                cc: *cc,
                variant: CudaVariant::Portable,
            },
            Device::Amd {
                processor,
                xnack,
                sramecc,
            } => Target::Amd {
                processor: processor.clone(),
                xnack: *xnack,
                sramecc: *sramecc,
            },
            Device::Apple { family } => Target::Apple(AppleTarget::Family(*family)),
        };
        target.fmt(f)
    }
}

/// Why a `--device` string was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown device `{input}`: {reason}")]
pub struct DeviceError {
    pub input: String,
    pub reason: &'static str,
}

impl FromStr for Device {
    type Err = DeviceError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let reason = "valid forms are local (this machine's GPU), sm_89 (a CUDA compute capability), gfx1100 or gfx90a:xnack- (an AMD target ID), apple-m3 or apple9 (an Apple GPU)";
        let error = || DeviceError {
            input: input.to_string(),
            reason,
        };
        if let Some(chip) = input.strip_prefix("apple-m") {
            let family = match chip {
                "1" => 7,
                "2" => 8,
                "3" | "4" => 9,
                _ => return Err(DeviceError { input: input.to_string(), reason: "known Apple chips are apple-m1 to apple-m4; give a family (apple9) for others" }),
            };
            return Ok(Device::Apple { family });
        }
        match input.parse::<Target>().map_err(|_| error())? {
            Target::CudaSm {
                cc,
                variant: CudaVariant::Portable | CudaVariant::ArchSpecific,
            } => Ok(Device::Cuda(cc)),
            Target::Amd {
                processor,
                xnack,
                sramecc,
            } => Ok(Device::Amd {
                processor,
                xnack,
                sramecc,
            }),
            Target::Apple(AppleTarget::Family(family)) => Ok(Device::Apple { family }),
            _ => Err(error()),
        }
    }
}

/// One artifact the resolver may pick.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    pub target: Target,
    pub format: Format,
    /// The PTX ISA version of PTX inside the artifact, when known.
    pub ptx_isa: Option<PtxIsa>,
}

/// What the caller knows about the runtime beyond the device itself.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResolveOptions {
    /// The newest PTX ISA the installed driver can JIT-compile (`--driver-ptx`); `None` = unknown.
    pub driver_ptx: Option<PtxIsa>,
}

/// Why a candidate cannot run on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    OtherBackend,
    /// Cubins run only on their own major version.
    MajorDiffers {
        built: ComputeCapability,
        device: ComputeCapability,
    },
    /// Cubins and family code run only on an equal or newer minor version.
    MinorTooNew {
        built: ComputeCapability,
        device: ComputeCapability,
    },
    /// `a` code runs on exactly its own compute capability.
    ArchSpecific {
        built: ComputeCapability,
        device: ComputeCapability,
    },
    /// PTX JIT-compiles only forward, to equal or newer devices.
    PtxNewerThanDevice {
        built: ComputeCapability,
        device: ComputeCapability,
    },
    /// The driver's JIT does not know this PTX ISA version.
    PtxIsaTooNew {
        artifact: PtxIsa,
        driver: PtxIsa,
    },
    ProcessorDiffers,
    NotAGenericMember,
    FeatureMismatch {
        feature: &'static str,
        built: FeatureSetting,
        device: FeatureSetting,
    },
    AppleFamilyTooNew {
        built: u8,
        device: u8,
    },
    Metal3NeedsApple7 {
        device: u8,
    },
}

/// How a candidate would run on the device, with a score: higher is closer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Native { score: u32 },
    Jit { score: u32 },
    Rejected(Rejection),
}

impl Verdict {
    /// One total order over usable verdicts: any native code beats any JIT, then closeness.
    fn rank(self) -> Option<u32> {
        match self {
            Verdict::Native { score } => Some((1 << 31) | score),
            Verdict::Jit { score } => Some(score),
            Verdict::Rejected(_) => None,
        }
    }
}

fn cc_score(cc: ComputeCapability, variant: CudaVariant) -> u32 {
    let variant_bonus = match variant {
        CudaVariant::Portable => 0,
        CudaVariant::FamilySpecific => 1,
        CudaVariant::ArchSpecific => 2,
    };
    ((u32::from(cc.major) * 16 + u32::from(cc.minor)) << 2) | variant_bonus
}

fn evaluate_cubin(
    built: ComputeCapability,
    variant: CudaVariant,
    device: ComputeCapability,
) -> Verdict {
    let score = cc_score(built, variant);
    match variant {
        CudaVariant::ArchSpecific if built != device => {
            Verdict::Rejected(Rejection::ArchSpecific { built, device })
        }
        _ if built.major != device.major => {
            Verdict::Rejected(Rejection::MajorDiffers { built, device })
        }
        _ if built.minor > device.minor => {
            Verdict::Rejected(Rejection::MinorTooNew { built, device })
        }
        _ => Verdict::Native { score },
    }
}

fn evaluate_ptx(
    built: ComputeCapability,
    variant: CudaVariant,
    isa: Option<PtxIsa>,
    device: ComputeCapability,
    options: &ResolveOptions,
) -> Verdict {
    if variant == CudaVariant::ArchSpecific && built != device {
        return Verdict::Rejected(Rejection::ArchSpecific { built, device });
    }
    if built > device {
        return Verdict::Rejected(Rejection::PtxNewerThanDevice { built, device });
    }
    if let (Some(artifact), Some(driver)) = (isa, options.driver_ptx) {
        if artifact > driver {
            return Verdict::Rejected(Rejection::PtxIsaTooNew { artifact, driver });
        }
    }
    Verdict::Jit {
        score: cc_score(built, variant),
    }
}

fn evaluate_feature(
    feature: &'static str,
    built: FeatureSetting,
    device: FeatureSetting,
) -> Result<u32, Rejection> {
    match built {
        FeatureSetting::Any => Ok(0),
        _ if built == device => Ok(1),
        _ => Err(Rejection::FeatureMismatch {
            feature,
            built,
            device,
        }),
    }
}

fn evaluate_amd(
    processor: &str,
    xnack: FeatureSetting,
    sramecc: FeatureSetting,
    device: &Device,
) -> Verdict {
    let Device::Amd {
        processor: device_processor,
        xnack: device_xnack,
        sramecc: device_sramecc,
    } = device
    else {
        return Verdict::Rejected(Rejection::OtherBackend);
    };
    if processor != device_processor {
        return Verdict::Rejected(Rejection::ProcessorDiffers);
    }
    let features = evaluate_feature("xnack", xnack, *device_xnack)
        .and_then(|x| Ok(x + evaluate_feature("sramecc", sramecc, *device_sramecc)?));
    match features {
        Ok(specified) => Verdict::Native {
            score: 4 | specified,
        },
        Err(rejection) => Verdict::Rejected(rejection),
    }
}

/// Judges one candidate for one device. The single source of truth for every rule.
pub fn evaluate(candidate: &Candidate, device: &Device, options: &ResolveOptions) -> Verdict {
    match (&candidate.target, device) {
        (Target::CudaSm { cc, variant }, Device::Cuda(device_cc)) => match candidate.format {
            Format::Ptx => evaluate_ptx(*cc, *variant, candidate.ptx_isa, *device_cc, options),
            Format::Fatbin => match evaluate_cubin(*cc, *variant, *device_cc) {
                native @ Verdict::Native { .. } => native,
                Verdict::Rejected(_) | Verdict::Jit { .. } => {
                    evaluate_ptx(*cc, *variant, candidate.ptx_isa, *device_cc, options)
                }
            },
            _ => evaluate_cubin(*cc, *variant, *device_cc),
        },
        (Target::CudaPtx { cc, variant }, Device::Cuda(device_cc)) => {
            evaluate_ptx(*cc, *variant, candidate.ptx_isa, *device_cc, options)
        }
        (
            Target::Amd {
                processor,
                xnack,
                sramecc,
            },
            Device::Amd { .. },
        ) => evaluate_amd(processor, *xnack, *sramecc, device),
        (Target::AmdGeneric { name }, Device::Amd { processor, .. }) => {
            let members = amd_generic_members(name).unwrap_or_default();
            if members.contains(&processor.as_str()) {
                Verdict::Native { score: 2 }
            } else {
                Verdict::Rejected(Rejection::NotAGenericMember)
            }
        }
        (Target::Apple(AppleTarget::Family(built)), Device::Apple { family }) => {
            if built > family {
                Verdict::Rejected(Rejection::AppleFamilyTooNew {
                    built: *built,
                    device: *family,
                })
            } else {
                Verdict::Native {
                    score: u32::from(*built) << 8,
                }
            }
        }
        (Target::Apple(AppleTarget::MetalVersion { major, minor }), Device::Apple { family }) => {
            if *major >= 3 && *family < 7 {
                Verdict::Rejected(Rejection::Metal3NeedsApple7 { device: *family })
            } else {
                Verdict::Native {
                    score: (u32::from(*major) << 4) | u32::from(*minor),
                }
            }
        }
        _ => Verdict::Rejected(Rejection::OtherBackend),
    }
}

/// Picks the best candidate for the device: native code over JIT, then the closest target.
/// Returns its index in `candidates`, or `None` when nothing can run.
pub fn resolve(
    candidates: &[Candidate],
    device: &Device,
    options: &ResolveOptions,
) -> Option<usize> {
    candidates
        .iter()
        .enumerate()
        .filter_map(|(index, candidate)| {
            Some((evaluate(candidate, device, options).rank()?, index))
        })
        // Ties (the same target built twice) go to the first listed.
        .max_by_key(|(rank, index)| (*rank, std::cmp::Reverse(*index)))
        .map(|(_, index)| index)
}

/// The verdict on every candidate plus the pick, for `--explain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    pub chosen: Option<usize>,
    pub verdicts: Vec<Verdict>,
}

pub fn explain(candidates: &[Candidate], device: &Device, options: &ResolveOptions) -> Explanation {
    Explanation {
        chosen: resolve(candidates, device, options),
        verdicts: candidates
            .iter()
            .map(|candidate| evaluate(candidate, device, options))
            .collect(),
    }
}

fn setting_name(setting: FeatureSetting) -> &'static str {
    match setting {
        FeatureSetting::Any => "unspecified",
        FeatureSetting::On => "on (+)",
        FeatureSetting::Off => "off (-)",
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejection::OtherBackend => write!(f, "built for another GPU vendor"),
            Rejection::MajorDiffers { built, device } => write!(f, "a cubin for {built} runs only on {}.x devices, this one is {device}", built.major),
            Rejection::MinorTooNew { built, device } => write!(f, "built for {built}, newer than the device's {device}"),
            Rejection::ArchSpecific { built, device } => write!(f, "arch-specific ('a') code for {built} runs only on exactly {built}, the device is {device}"),
            Rejection::PtxNewerThanDevice { built, device } => write!(f, "PTX for {built} cannot be JIT-compiled for the older device {device}"),
            Rejection::PtxIsaTooNew { artifact, driver } => write!(f, "PTX ISA {artifact} is newer than the driver's {driver}; update the driver or build with an older toolchain"),
            Rejection::ProcessorDiffers => write!(f, "built for another AMD processor"),
            Rejection::NotAGenericMember => write!(f, "the device is not a member of this generic target"),
            Rejection::FeatureMismatch { feature, built, device } => {
                write!(f, "built with {feature} {}, the device has {feature} {}", setting_name(*built), setting_name(*device))?;
                if *device == FeatureSetting::Any {
                    write!(f, "; state it in --device, e.g. gfx90a:{feature}-")?;
                }
                Ok(())
            }
            Rejection::AppleFamilyTooNew { built, device } => write!(f, "built for apple{built}, newer than the device's apple{device}"),
            Rejection::Metal3NeedsApple7 { device } => write!(f, "Metal 3 needs an apple7 or newer GPU, the device is apple{device}"),
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Native { .. } => write!(f, "runs natively"),
            Verdict::Jit { .. } => write!(f, "runs after the driver JIT-compiles its PTX"),
            Verdict::Rejected(rejection) => write!(f, "rejected: {rejection}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(target: &str, format: Format) -> Candidate {
        Candidate {
            target: target.parse().unwrap(),
            format,
            ptx_isa: None,
        }
    }

    fn cubins(targets: &[&str]) -> Vec<Candidate> {
        targets
            .iter()
            .map(|target| candidate(target, Format::Cubin))
            .collect()
    }

    fn pick(candidates: &[Candidate], device: &str) -> Option<String> {
        resolve(
            candidates,
            &device.parse().unwrap(),
            &ResolveOptions::default(),
        )
        .map(|index| candidates[index].target.to_string())
    }

    /// The resolver table: (artifacts, device, expected pick).
    #[test]
    fn resolver_table() {
        let cuda = {
            let mut set = cubins(&["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"]);
            set.push(candidate("compute_90", Format::Ptx));
            set
        };
        let rocm = cubins(&["gfx1030", "gfx1100", "gfx90a", "gfx942"]);
        let rocm_with_generic = {
            let mut set = rocm.clone();
            set.push(candidate("gfx11-generic", Format::CodeObject));
            set.push(candidate("gfx9-generic", Format::CodeObject));
            set
        };
        let table: Vec<(&str, Vec<Candidate>, &str, Option<&str>)> = vec![
            // Selector error 1: cc >= 9.0 picked the sm_90 cubin, which cannot run on Blackwell.
            (
                "blackwell gets PTX, not the sm_90 cubin",
                cuda.clone(),
                "sm_100",
                Some("compute_90"),
            ),
            (
                "blackwell consumer gets PTX too",
                cuda.clone(),
                "sm_120",
                Some("compute_90"),
            ),
            (
                "blackwell with no PTX gets nothing",
                cuda[..6].to_vec(),
                "sm_100",
                None,
            ),
            // Selector error 2: below 8.6 got PTX built for sm_86, which cannot JIT on 8.0.
            (
                "8.0 refuses sm_86 PTX",
                vec![candidate("sm_86", Format::Ptx)],
                "sm_80",
                None,
            ),
            (
                "8.0 takes its own cubin",
                cuda.clone(),
                "sm_80",
                Some("sm_80"),
            ),
            (
                "8.7 takes the closest lower minor",
                cuda.clone(),
                "sm_87",
                Some("sm_86"),
            ),
            (
                "8.9 takes its own cubin",
                cuda.clone(),
                "sm_89",
                Some("sm_89"),
            ),
            (
                "9.0 prefers the arch-specific cubin",
                cuda.clone(),
                "sm_90",
                Some("sm_90a"),
            ),
            ("7.0 has nothing", cuda.clone(), "sm_70", None),
            (
                "native beats JIT of a closer PTX",
                vec![
                    candidate("sm_80", Format::Cubin),
                    candidate("compute_86", Format::Ptx),
                ],
                "sm_86",
                Some("sm_80"),
            ),
            (
                "family code runs within its family",
                cubins(&["sm_100f"]),
                "sm_103",
                Some("sm_100f"),
            ),
            (
                "family code stays in its family",
                cubins(&["sm_100f"]),
                "sm_120",
                None,
            ),
            (
                "fatbin falls back to its PTX",
                vec![candidate("sm_80", Format::Fatbin)],
                "sm_90",
                Some("sm_80"),
            ),
            // Selector error 3: every gfx90* got gfx90a.
            ("gfx908 refuses gfx90a", rocm.clone(), "gfx908", None),
            (
                "gfx906 takes gfx9-generic, not gfx90a",
                rocm_with_generic.clone(),
                "gfx906",
                Some("gfx9-generic"),
            ),
            (
                "gfx90a takes gfx90a",
                rocm_with_generic.clone(),
                "gfx90a",
                Some("gfx90a"),
            ),
            // Selector error 4: every gfx110* got gfx1100.
            ("gfx1101 refuses gfx1100", rocm.clone(), "gfx1101", None),
            (
                "gfx1101 takes gfx11-generic",
                rocm_with_generic.clone(),
                "gfx1101",
                Some("gfx11-generic"),
            ),
            (
                "gfx1100 prefers its own code over generic",
                rocm_with_generic.clone(),
                "gfx1100",
                Some("gfx1100"),
            ),
            (
                "gfx1030 is not in gfx11-generic",
                cubins(&["gfx11-generic"]),
                "gfx1030",
                None,
            ),
            // Target-ID features: unspecified means any.
            (
                "xnack- device takes xnack- code",
                cubins(&["gfx90a", "gfx90a:xnack-", "gfx90a:xnack+"]),
                "gfx90a:xnack-",
                Some("gfx90a:xnack-"),
            ),
            (
                "xnack+ device refuses xnack- code",
                cubins(&["gfx90a:xnack-"]),
                "gfx90a:xnack+",
                None,
            ),
            (
                "unknown device xnack takes only any-xnack code",
                cubins(&["gfx90a:xnack-", "gfx90a"]),
                "gfx90a",
                Some("gfx90a"),
            ),
            (
                "sramecc must match too",
                cubins(&["gfx942:sramecc+:xnack-", "gfx942:sramecc-"]),
                "gfx942:sramecc-:xnack-",
                Some("gfx942:sramecc-"),
            ),
            // Metal.
            (
                "M3 takes the closest family",
                cubins(&["apple7", "apple8", "metal3.0"]),
                "apple-m3",
                Some("apple8"),
            ),
            (
                "M1 refuses apple8",
                cubins(&["apple8", "metal3.1"]),
                "apple-m1",
                Some("metal3.1"),
            ),
            ("CUDA code never goes to AMD", cuda.clone(), "gfx1100", None),
        ];
        for (name, candidates, device, expected) in table {
            assert_eq!(pick(&candidates, device).as_deref(), expected, "{name}");
        }
    }

    #[test]
    fn the_driver_limits_ptx_isa() {
        let ptx = Candidate {
            target: "compute_90".parse().unwrap(),
            format: Format::Ptx,
            ptx_isa: Some(PtxIsa { major: 8, minor: 5 }),
        };
        let device: Device = "sm_100".parse().unwrap();
        let old_driver = ResolveOptions {
            driver_ptx: Some("8.4".parse().unwrap()),
        };
        let new_driver = ResolveOptions {
            driver_ptx: Some("8.7".parse().unwrap()),
        };
        assert_eq!(
            resolve(std::slice::from_ref(&ptx), &device, &old_driver),
            None
        );
        assert_eq!(
            resolve(std::slice::from_ref(&ptx), &device, &new_driver),
            Some(0)
        );
        let verdict = evaluate(&ptx, &device, &old_driver);
        assert!(
            verdict
                .to_string()
                .contains("PTX ISA 8.5 is newer than the driver's 8.4"),
            "{verdict}"
        );
    }

    #[test]
    fn explain_gives_a_reason_for_every_candidate() {
        let candidates = cubins(&["sm_90", "sm_90a"]);
        let explanation = explain(
            &candidates,
            &"sm_100".parse().unwrap(),
            &ResolveOptions::default(),
        );
        assert_eq!(explanation.chosen, None);
        let reasons: Vec<String> = explanation
            .verdicts
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            reasons,
            [
                "rejected: a cubin for 9.0 runs only on 9.x devices, this one is 10.0",
                "rejected: arch-specific ('a') code for 9.0 runs only on exactly 9.0, the device is 10.0"
            ]
        );
    }

    #[test]
    fn devices_parse_from_the_issue_forms() {
        assert_eq!(
            "sm_89".parse::<Device>().unwrap(),
            Device::Cuda(ComputeCapability { major: 8, minor: 9 })
        );
        assert_eq!(
            "apple-m3".parse::<Device>().unwrap(),
            Device::Apple { family: 9 }
        );
        assert!(matches!(
            "gfx1100:xnack-".parse::<Device>().unwrap(),
            Device::Amd {
                xnack: FeatureSetting::Off,
                ..
            }
        ));
        assert!("compute_90".parse::<Device>().is_err());
        assert!("gfx11-generic".parse::<Device>().is_err());
        assert!("apple-m9"
            .parse::<Device>()
            .unwrap_err()
            .to_string()
            .contains("apple9"));
    }

    const POOL: &[(&str, Format)] = &[
        ("sm_75", Format::Cubin),
        ("sm_80", Format::Cubin),
        ("sm_86", Format::Ptx),
        ("sm_89", Format::Fatbin),
        ("sm_90a", Format::Cubin),
        ("sm_100f", Format::Cubin),
        ("compute_80", Format::Ptx),
        ("compute_90a", Format::Ptx),
        ("gfx90a:xnack-", Format::CodeObject),
        ("gfx942:sramecc+", Format::CodeObject),
        ("gfx1100", Format::CodeObject),
        ("gfx11-generic", Format::CodeObject),
        ("apple8", Format::Metallib),
        ("metal3.1", Format::Metallib),
    ];
    const DEVICES: &[&str] = &[
        "sm_70",
        "sm_80",
        "sm_87",
        "sm_90",
        "sm_100",
        "sm_103",
        "sm_120",
        "gfx90a:xnack-",
        "gfx90a",
        "gfx942:sramecc+:xnack+",
        "gfx1100",
        "gfx1103",
        "apple-m1",
        "apple-m4",
    ];

    proptest::proptest! {
        /// Whatever the candidates and their order, the pick can run, native code wins when
        /// there is any, and the pick does not depend on the order.
        #[test]
        fn the_pick_runs_and_prefers_native(picks in proptest::sample::subsequence((0..POOL.len()).collect::<Vec<_>>(), 0..POOL.len()), device in proptest::sample::select(DEVICES), reverse: bool) {
            let mut candidates: Vec<Candidate> = picks.iter().map(|&index| candidate(POOL[index].0, POOL[index].1)).collect();
            let device: Device = device.parse().unwrap();
            let options = ResolveOptions::default();
            let chosen = resolve(&candidates, &device, &options).map(|index| candidates[index].clone());
            let verdicts: Vec<Verdict> = candidates.iter().map(|candidate| evaluate(candidate, &device, &options)).collect();
            match &chosen {
                None => {
                    let all_rejected = verdicts.iter().all(|verdict| matches!(verdict, Verdict::Rejected(_)));
                    proptest::prop_assert!(all_rejected);
                }
                Some(pick) => {
                    let verdict = evaluate(pick, &device, &options);
                    let runs = !matches!(verdict, Verdict::Rejected(_));
                    proptest::prop_assert!(runs);
                    if verdicts.iter().any(|verdict| matches!(verdict, Verdict::Native { .. })) {
                        let native = matches!(verdict, Verdict::Native { .. });
                        proptest::prop_assert!(native);
                    }
                }
            }
            if reverse {
                candidates.reverse();
            }
            let again = resolve(&candidates, &device, &options).map(|index| candidates[index].clone());
            proptest::prop_assert_eq!(again, chosen);
        }
    }
}
