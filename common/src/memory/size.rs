//! Byte sizes as people write them: `64MiB`, `2GiB`, `512kB`, `1000000`.

/// Why a size does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error(
        "'{0}' is not a size: write a number of bytes with an optional unit, \
         e.g. 64MiB, 2GiB, 512MB, 1048576 (units B, kB, MB, GB, TB, KiB, MiB, GiB, TiB)"
    )]
    Unparsed(String),
    #[error("size '{0}' is too large")]
    TooLarge(String),
    #[error("a memory limit of 0 leaves no room for any weights; leave the limit out to offer what the device has")]
    Zero,
}

const UNITS: &[(&str, u64)] = &[
    ("b", 1),
    ("kb", 1_000),
    ("mb", 1_000_000),
    ("gb", 1_000_000_000),
    ("tb", 1_000_000_000_000),
    ("k", 1 << 10),
    ("kib", 1 << 10),
    ("m", 1 << 20),
    ("mib", 1 << 20),
    ("g", 1 << 30),
    ("gib", 1 << 30),
    ("t", 1 << 40),
    ("tib", 1 << 40),
];

/// Parses a size: a number (decimals allowed with a unit) and an optional
/// unit, case-insensitive, spaces allowed between (`1.5 GiB`).
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = (&t[..split], t[split..].trim().to_ascii_lowercase());
    let bad = || SizeError::Unparsed(text.to_string());
    let scale = if unit.is_empty() {
        1
    } else {
        UNITS
            .iter()
            .find(|(u, _)| *u == unit)
            .map(|&(_, s)| s)
            .ok_or_else(bad)?
    };
    if number.is_empty() {
        return Err(bad());
    }
    if let Ok(n) = number.parse::<u64>() {
        return n
            .checked_mul(scale)
            .ok_or_else(|| SizeError::TooLarge(text.to_string()));
    }
    let x: f64 = number.parse().map_err(|_| bad())?;
    let bytes = x * scale as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(SizeError::TooLarge(text.to_string()));
    }
    Ok(bytes.round() as u64)
}

/// A memory limit: a size that is not 0.
pub fn parse_limit(text: &str) -> Result<u64, SizeError> {
    match parse_size(text)? {
        0 => Err(SizeError::Zero),
        n => Ok(n),
    }
}

/// `134217728` → `128.0 MiB`; under 1 KiB in bytes.
pub fn format_size(bytes: u64) -> String {
    const STEPS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < STEPS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", STEPS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_and_decimal_units() {
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("2 gib"), Ok(2 << 30));
        assert_eq!(parse_size("512MB"), Ok(512_000_000));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("96M"), Ok(96 << 20));
        assert_eq!(parse_size("0"), Ok(0));
    }

    #[test]
    fn bad_sizes_are_clear_errors() {
        for bad in ["", "MiB", "12 parsecs", "-5MiB", "1..2GiB", "GiB5"] {
            assert!(
                matches!(parse_size(bad), Err(SizeError::Unparsed(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            parse_size("99999999999TiB"),
            Err(SizeError::TooLarge(_))
        ));
        assert_eq!(parse_limit("0MiB"), Err(SizeError::Zero));
        assert!(parse_size("12 parsecs")
            .unwrap_err()
            .to_string()
            .contains("64MiB"));
    }

    #[test]
    fn sizes_format_in_binary_units() {
        assert_eq!(format_size(512), "512 B");
        assert_eq!(format_size(128 << 20), "128.0 MiB");
        assert_eq!(format_size(3 << 29), "1.5 GiB");
    }
}
