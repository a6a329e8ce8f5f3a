//! Human-readable sizes and times.

/// Bytes in binary units: `512 B`, `1.50 KiB`, `3.00 MiB`, `2.25 GiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

/// A count and its noun, plural unless the count is 1: `1 allocation`, `3 allocations`,
/// `0 frees` (every noun shown takes an `s`).
pub fn counted(count: u64, noun: &str) -> String {
    match count {
        1 => format!("1 {noun}"),
        n => format!("{n} {noun}s"),
    }
}

/// Seconds with microsecond precision from nanoseconds.
pub fn seconds(ns: u64) -> String {
    format!("{:.6}s", ns as f64 / 1e9)
}

/// A time resolution in the largest unit that states it exactly: `1 ns`, `100 us`, `10 ms`.
pub fn resolution(ns: u64) -> String {
    let (count, unit) = [(1_000_000_000, "s"), (1_000_000, "ms"), (1_000, "us")]
        .into_iter()
        .find(|(unit_ns, _)| ns >= *unit_ns && ns.is_multiple_of(*unit_ns))
        .map_or((ns, "ns"), |(unit_ns, unit)| (ns / unit_ns, unit));
    format!("{count} {unit}")
}

/// What a log's times are worth when they were recorded at a coarser resolution than 1 ns
/// (`VRAMSHIM_TIME_RESOLUTION`), for the lines that describe a log; `None` at full resolution.
pub fn resolution_note(ns: u64) -> Option<String> {
    (ns > 1).then(|| {
        format!(
            "times recorded at {} resolution (VRAMSHIM_TIME_RESOLUTION): each is rounded down \
             to a multiple of it",
            resolution(ns)
        )
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn resolutions_use_the_largest_exact_unit() {
        assert_eq!(super::resolution(1), "1 ns");
        assert_eq!(super::resolution(100), "100 ns");
        assert_eq!(super::resolution(1_000), "1 us");
        assert_eq!(super::resolution(10_000_000), "10 ms");
        assert_eq!(super::resolution(1_000_000_000), "1 s");
        assert_eq!(super::resolution(1_500), "1500 ns");
        assert_eq!(super::resolution_note(1), None);
    }

    #[test]
    fn sizes_use_binary_units() {
        assert_eq!(super::counted(1, "allocation"), "1 allocation");
        assert_eq!(super::counted(0, "free"), "0 frees");
        assert_eq!(super::counted(2, "more frame"), "2 more frames");
        assert_eq!(super::bytes(0), "0 B");
        assert_eq!(super::bytes(1023), "1023 B");
        assert_eq!(super::bytes(1536), "1.50 KiB");
        assert_eq!(super::bytes(3 << 20), "3.00 MiB");
        assert_eq!(super::bytes(9 << 30), "9.00 GiB");
        assert_eq!(super::seconds(1_500_000), "0.001500s");
    }
}

/// Parses a time since the start: `1.5` or `1.5s` (seconds), `250ms`, `40us`, `1200ns`.
pub fn parse_time(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (number, scale) = [("ns", 1.0), ("us", 1e3), ("ms", 1e6), ("s", 1e9)]
        .iter()
        .find_map(|(suffix, scale)| text.strip_suffix(suffix).map(|n| (n, *scale)))
        .unwrap_or((text, 1e9));
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("not a time: {text:?} (examples: 1.5, 1.5s, 250ms, 40us)"))?;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("not a time: {text:?} (must be zero or more)"));
    }
    Ok((value * scale).round() as u64)
}

#[cfg(test)]
mod time_tests {
    #[test]
    fn times_parse_with_units() {
        assert_eq!(super::parse_time("1.5"), Ok(1_500_000_000));
        assert_eq!(super::parse_time("1.5s"), Ok(1_500_000_000));
        assert_eq!(super::parse_time("250ms"), Ok(250_000_000));
        assert_eq!(super::parse_time("40us"), Ok(40_000));
        assert_eq!(super::parse_time("1200ns"), Ok(1200));
        assert!(super::parse_time("-1").is_err());
        assert!(super::parse_time("soon").is_err());
    }
}

/// Parses a size in bytes: `1073741824`, `512MiB`, `24GiB`, `24G`, `1.5TiB`, `64KiB`, `100B`.
/// Every suffix is binary (`K`/`KB`/`KiB` = 1024, `M` = 1024², `G`, `T`, `P`); case and
/// spaces before the suffix do not matter.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let lower = text.to_ascii_lowercase();
    let split = lower
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(lower.len());
    let (number, suffix) = lower.split_at(split);
    let shift = match suffix.trim() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        "p" | "pb" | "pib" => 50,
        _ => {
            return Err(format!(
                "not a size: {text:?} (examples: 24GiB, 512MiB, 24G, 1073741824)"
            ));
        }
    };
    let bad = || format!("not a size: {text:?} (examples: 24GiB, 512MiB, 24G, 1073741824)");
    if number.is_empty() {
        return Err(bad());
    }
    if let Ok(whole) = number.parse::<u64>() {
        return whole
            .checked_mul(1u64 << shift)
            .ok_or_else(|| format!("size too large: {text:?}"));
    }
    let value: f64 = number.parse().map_err(|_| bad())?;
    let bytes = value * (1u64 << shift) as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
        return Err(format!("size too large: {text:?}"));
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod size_tests {
    use super::parse_size;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("24GiB"), Ok(24 << 30));
        assert_eq!(parse_size("24G"), Ok(24 << 30));
        assert_eq!(parse_size("24gb"), Ok(24 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("512 M"), Ok(512 << 20));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("100B"), Ok(100));
        assert_eq!(parse_size("1TiB"), Ok(1 << 40));
        assert!(parse_size("").is_err());
        assert!(parse_size("GiB").is_err());
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("99999999999P").is_err());
    }
}
