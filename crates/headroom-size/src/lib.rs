//! Parsing and printing byte sizes, so every flag that takes memory (`--budget 6G`,
//! `--memory-limit 8GiB`) accepts the same forms and every report prints them the same way.

use std::fmt;

/// A size string that could not be understood.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid size `{input}`: {reason}; valid forms are a number of bytes (`1073741824`) or a number with a unit: `512M`, `1.5G`, `2GiB`, `800MB`, `64k`")]
pub struct SizeError {
    input: String,
    reason: &'static str,
}

/// Parses `1.5G`, `512MiB`, `800MB`, `64k` or a plain number of bytes.
///
/// Units are binary (powers of 1024) whether or not they say `i`: compiler and kernel memory
/// figures are binary, and `-m 4G` meaning 4 GiB is what users of docker and systemd expect.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let error = |reason| SizeError {
        input: input.to_string(),
        reason,
    };
    let text = input.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    if number.is_empty() {
        return Err(error("it does not start with a number"));
    }
    let value: f64 = number
        .parse()
        .map_err(|_| error("the number is malformed"))?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => {
            return Err(error(
                "the unit is not one of B, K, M, G, T (optionally with `iB` or `B`)",
            ))
        }
    };
    let bytes = value * multiplier as f64;
    // `u64::MAX as f64` is 2^64, one more than fits: the sizes just under it print as
    // `16777216.0 TiB`, which is exactly that, and must read back (as the largest size).
    if !bytes.is_finite() || bytes > u64::MAX as f64 {
        return Err(error("it is too large"));
    }
    Ok(bytes.round() as u64)
}

/// Formats bytes for people: `1.50 GiB`, `512.0 MiB`, `900 B`.
pub fn format_size(bytes: u64) -> String {
    Size(bytes).to_string()
}

/// A byte count that displays itself in binary units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Size(pub u64);

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
        if self.0 < 1024 {
            return write!(f, "{} B", self.0);
        }
        let mut value = self.0 as f64 / 1024.0;
        let mut unit = 0;
        while value >= 1024.0 && unit < UNITS.len() - 1 {
            value /= 1024.0;
            unit += 1;
        }
        let decimals = if value < 10.0 { 2 } else { 1 };
        write!(f, "{value:.decimals$} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_documented_form() {
        assert_eq!(parse_size("1073741824"), Ok(1 << 30));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("800MB"), Ok(800 << 20));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size(" 6 G "), Ok(6 << 30));
    }

    #[test]
    fn rejects_bad_forms_with_the_input_named() {
        for bad in ["", "G", "1.2.3G", "12X", "-5G", "1e400"] {
            let err = parse_size(bad).unwrap_err();
            assert!(err.to_string().contains(&format!("`{bad}`")), "{err}");
        }
    }

    #[test]
    fn the_largest_sizes_read_back_as_they_print() {
        let largest = u64::MAX - 2047;
        assert_eq!(format_size(largest), "16777216.0 TiB");
        assert_eq!(parse_size(&format_size(largest)), Ok(u64::MAX));
        assert!(parse_size("16777217T").is_err());
    }

    #[test]
    fn formats_in_binary_units() {
        assert_eq!(format_size(900), "900 B");
        assert_eq!(format_size(3 << 29), "1.50 GiB");
        assert_eq!(format_size(512 << 20), "512.0 MiB");
    }
}
