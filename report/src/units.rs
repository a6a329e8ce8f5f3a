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

/// Seconds with microsecond precision from nanoseconds.
pub fn seconds(ns: u64) -> String {
    format!("{:.6}s", ns as f64 / 1e9)
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_use_binary_units() {
        assert_eq!(super::bytes(0), "0 B");
        assert_eq!(super::bytes(1023), "1023 B");
        assert_eq!(super::bytes(1536), "1.50 KiB");
        assert_eq!(super::bytes(3 << 20), "3.00 MiB");
        assert_eq!(super::bytes(9 << 30), "9.00 GiB");
        assert_eq!(super::seconds(1_500_000), "0.001500s");
    }
}
