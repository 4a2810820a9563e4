//! PostgreSQL WAL positions (`X/Y` text form, a `u64` on the wire).

use std::fmt;
use std::str::FromStr;

/// A WAL position. Ordered; `Lsn(0)` means "none" / "from the slot".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl Lsn {
    pub const ZERO: Lsn = Lsn(0);

    /// Bytes of WAL between `self` and a later position (0 when `later` is behind).
    pub fn bytes_until(self, later: Lsn) -> u64 {
        later.0.saturating_sub(self.0)
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl serde::Serialize for Lsn {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not an LSN: expected two hexadecimal numbers separated by a slash, like 0/16B3748"
)]
pub struct ParseLsnError(pub String);

impl FromStr for Lsn {
    type Err = ParseLsnError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseLsnError(s.to_string());
        let (hi, lo) = s.trim().split_once('/').ok_or_else(err)?;
        let valid = |part: &str| !part.is_empty() && part.len() <= 8;
        if !valid(hi) || !valid(lo) {
            return Err(err());
        }
        let hi = u32::from_str_radix(hi, 16).map_err(|_| err())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| err())?;
        Ok(Lsn((u64::from(hi) << 32) | u64::from(lo)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_round_trips() {
        for v in [0u64, 1, 0x16B3748, 0xFFFF_FFFF, 0x1_0000_0000, u64::MAX] {
            let lsn = Lsn(v);
            assert_eq!(lsn.to_string().parse::<Lsn>().unwrap(), lsn);
        }
        assert_eq!(Lsn(0x1_0000_00AB).to_string(), "1/AB");
    }

    #[test]
    fn malformed_text_is_rejected() {
        for bad in [
            "",
            "0",
            "/",
            "0/",
            "/1",
            "g/1",
            "1/2/3",
            "123456789/0",
            "-1/0",
        ] {
            assert!(bad.parse::<Lsn>().is_err(), "{bad} parsed");
        }
    }
}
