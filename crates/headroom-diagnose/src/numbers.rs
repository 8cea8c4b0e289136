//! Pulls the sizes out of an out-of-memory message, so a report can say "asked for 2.26 GiB
//! with 3.03 GiB free" instead of repeating the text. PyTorch has changed its wording several
//! times (`cached` before 1.5, `reserved in total by PyTorch` until 2.0, `GPU 0 has a total
//! capacty of` — sic — in 2.1, `total capacity` since); every form is covered.

use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

/// The sizes an out-of-memory message states, in bytes. Absent when the message does not say.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct OomNumbers {
    /// The allocation that failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requested: Option<u64>,
    /// The device's total memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u64>,
    /// Free device memory at the time of the failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub free: Option<u64>,
    /// Memory handed out to tensors by the framework's allocator.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocated: Option<u64>,
    /// Memory the framework's allocator holds in total (allocated plus cached).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved: Option<u64>,
    /// Memory the allocator holds but has not handed out (fragmentation shows up here).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved_unallocated: Option<u64>,
    /// Everything this process holds on the device, framework or not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub process_in_use: Option<u64>,
    /// The device index, e.g. `0` for `GPU 0`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<u32>,
}

impl OomNumbers {
    pub fn is_empty(&self) -> bool {
        *self == OomNumbers::default()
    }
}

const SIZE: &str = r"(\d+(?:\.\d*)?\s?(?:[KMGT]i?B|[KMGT]\b|bytes|B\b)|0 bytes)";

fn size_regex(template: &str) -> Regex {
    Regex::new(&template.replace("{SIZE}", SIZE)).expect("size patterns are valid")
}

static REQUESTED: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    [
        r"Tried to allocate {SIZE}",
        r"Unable to allocate {SIZE}",
        r"(?:trying to allocate|allocating|failed to allocate) (\d+) bytes",
        r"failed to allocate \S+ \((\d+) bytes\)",
        r"out of memory allocating (\d+) bytes",
        r"memory allocation of (\d+) bytes failed",
        r"Failed to alloc DEVICE memory: (\d+)",
        r"Could not satisfy request for (\d+) bytes",
    ]
    .iter()
    .map(|t| size_regex(t))
    .collect()
});

static CAPACITY: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    [r"{SIZE} total capacity", r"total capac(?:i)?ty of {SIZE}"]
        .iter()
        .map(|t| size_regex(t))
        .collect()
});

static FREE: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    [
        r"already allocated; {SIZE} free",
        r"of which {SIZE} is free",
    ]
    .iter()
    .map(|t| size_regex(t))
    .collect()
});

static ALLOCATED: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    [
        r"{SIZE} already allocated",
        r"{SIZE} is allocated by PyTorch",
    ]
    .iter()
    .map(|t| size_regex(t))
    .collect()
});

static RESERVED: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    [r"{SIZE} reserved in total by PyTorch"]
        .iter()
        .map(|t| size_regex(t))
        .collect()
});

static CACHED: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    [r"free; {SIZE} cached"]
        .iter()
        .map(|t| size_regex(t))
        .collect()
});

static RESERVED_UNALLOCATED: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    [r"{SIZE} is reserved by PyTorch but unallocated"]
        .iter()
        .map(|t| size_regex(t))
        .collect()
});

static PROCESS_IN_USE: LazyLock<Vec<Regex>> = LazyLock::new(|| {
    [r"this process has {SIZE} memory in use"]
        .iter()
        .map(|t| size_regex(t))
        .collect()
});

static DEVICE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\(GPU (\d+);|GPU (\d+) has a total").expect("device pattern is valid")
});

/// Reads the sizes stated in `text` (usually the line that matched a rule).
pub fn extract(text: &str) -> OomNumbers {
    let first = |patterns: &[Regex]| patterns.iter().find_map(|re| capture_size(re, text));
    let allocated = first(&ALLOCATED);
    let reserved_unallocated = first(&RESERVED_UNALLOCATED);
    let cached = first(&CACHED);
    // PyTorch before 1.5 reported `cached` (held but unused); 2.x reports `reserved but
    // unallocated`. Either way reserved = allocated + that.
    let unallocated = reserved_unallocated.or(cached);
    let reserved = first(&RESERVED).or_else(|| Some(allocated? + unallocated?));
    OomNumbers {
        requested: first(&REQUESTED),
        capacity: first(&CAPACITY),
        free: first(&FREE),
        allocated,
        reserved,
        reserved_unallocated: unallocated,
        process_in_use: first(&PROCESS_IN_USE),
        device: DEVICE.captures(text).and_then(|c| {
            c.get(1)
                .or_else(|| c.get(2))
                .and_then(|m| m.as_str().parse().ok())
        }),
    }
}

fn capture_size(re: &Regex, text: &str) -> Option<u64> {
    let captured = re.captures(text)?.get(1)?.as_str();
    parse_reported_size(captured)
}

/// Sizes as tools print them: `20.00 MiB`, `0 bytes`, `117. GiB` (NumPy), `890.06M`, `41.2 GB`.
fn parse_reported_size(text: &str) -> Option<u64> {
    let text = text.trim();
    if let Some(number) = text.strip_suffix("bytes") {
        return number.trim().parse().ok();
    }
    // NumPy prints `117. GiB`; the shared size parser wants a digit after the point.
    let normalised = text.replace(". ", ".0 ");
    headroom_size::parse_size(&normalised).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    fn approx(bytes: Option<u64>, expected: f64) -> bool {
        bytes.is_some_and(|b| (b as f64 - expected).abs() / expected < 1e-3)
    }

    #[test]
    fn reads_every_printed_size_form() {
        assert_eq!(parse_reported_size("0 bytes"), Some(0));
        assert_eq!(parse_reported_size("20.00 MiB"), Some(20 * MIB));
        assert_eq!(parse_reported_size("117. GiB"), Some(117 * GIB));
        assert_eq!(parse_reported_size("7406166528"), Some(7_406_166_528));
        assert!(approx(parse_reported_size("41.2 GB"), 41.2 * GIB as f64));
    }

    #[test]
    fn pytorch_2_message_gives_reserved_as_allocated_plus_unallocated() {
        let numbers = extract(
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.00 MiB. GPU 0 has a total capacity of 23.65 GiB of which 11.06 MiB is free. Including non-PyTorch memory, this process has 23.60 GiB memory in use. Of the allocated memory 22.90 GiB is allocated by PyTorch, and 194.87 MiB is reserved by PyTorch but unallocated.",
        );
        assert_eq!(numbers.requested, Some(22 * MIB));
        assert!(approx(numbers.capacity, 23.65 * GIB as f64));
        assert!(approx(numbers.free, 11.06 * MIB as f64));
        assert!(approx(numbers.process_in_use, 23.60 * GIB as f64));
        assert!(approx(
            numbers.reserved,
            22.90 * GIB as f64 + 194.87 * MIB as f64
        ));
        assert_eq!(numbers.device, Some(0));
    }

    #[test]
    fn text_without_sizes_gives_nothing() {
        assert!(extract("RuntimeError: CUDA error: out of memory").is_empty());
    }
}
