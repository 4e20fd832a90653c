//! Units: memory in whole bytes, shares in basis points, and how both are read and shown.
//!
//! "GB" means 2^30 bytes throughout. Nothing here compares floating-point numbers: a float from a
//! request is turned into whole units once, at the edge, and everything after is integer arithmetic.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::{Add, AddAssign, Sub};

/// One GB as Tessera counts it: 2^30 bytes.
pub const GB: u64 = 1 << 30;

/// The largest memory figure a request may state: 1 PiB. Anything larger is a typo, not a GPU.
pub const MAX_GB: u64 = 1 << 20;

/// An amount of memory, in bytes.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Bytes(pub u64);

impl Bytes {
    /// No memory at all.
    pub const ZERO: Bytes = Bytes(0);

    /// A whole number of GB.
    pub const fn gb(gb: u64) -> Bytes {
        Bytes(gb * GB)
    }

    /// Reads a GB figure from a request (such as `2.5`), rounded to whole bytes once.
    ///
    /// Refuses what no GPU or machine could mean: not a number, infinite, negative, or over 1 PiB.
    pub fn from_gb(gb: f64) -> Result<Bytes, UnitError> {
        if !gb.is_finite() {
            return Err(UnitError::NotANumber);
        }
        if gb < 0.0 {
            return Err(UnitError::Negative);
        }
        if gb > MAX_GB as f64 {
            return Err(UnitError::TooLarge);
        }
        // Exact for every f64 in range: the product is at most 2^50, well inside f64's 53-bit mantissa.
        Ok(Bytes((gb * GB as f64).round() as u64))
    }

    /// The bytes as a number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// Subtraction that stops at zero.
    pub fn saturating_sub(self, other: Bytes) -> Bytes {
        Bytes(self.0.saturating_sub(other.0))
    }

    /// Shown as GB the way the seed writes it: at most one decimal, no trailing ".0" (`7`, `6.5`).
    pub fn gb_text(self) -> String {
        tenths_text((u128::from(self.0) * 10 + u128::from(GB) / 2) / u128::from(GB))
    }

    /// A size as a person reads it: in GB as [`Bytes::gb_text`] writes it, or in MB (rounded up) between
    /// nothing and one GB, where a small model's figures would all read "0 GB": `10 MB`, `6.5 GB`, `0 GB`.
    pub fn size_text(self) -> String {
        const MB: u64 = GB >> 10;
        if self.0 > 0 && self.0 < GB {
            format!("{} MB", self.0.div_ceil(MB))
        } else {
            format!("{} GB", self.gb_text())
        }
    }

    /// [`Bytes::gb_text`] for an engine to size itself by: never over these bytes, but for the kilobyte a
    /// share's rounding to whole bytes leaves (30 % of 96 GB reads 28.8, not 28.7); else rounded down.
    /// Under a tenth of a GB, to the millionth (about a kilobyte) rounded down, where "0" would tell the
    /// engine it has nothing: 82 MB reads `0.080078`.
    pub fn gb_text_at_most(self) -> String {
        let tenths = (u128::from(self.0) * 10 + u128::from(GB) / 2) / u128::from(GB);
        let nearest = tenths * u128::from(GB) / 10;
        let tenths = if nearest > u128::from(self.0) + 1024 {
            u128::from(self.0) * 10 / u128::from(GB)
        } else {
            tenths
        };
        if tenths == 0 && self.0 > 0 {
            let millionths = u128::from(self.0) * 1_000_000 / u128::from(GB);
            let text = format!("0.{millionths:06}");
            return text.trim_end_matches('0').trim_end_matches('.').to_owned();
        }
        tenths_text(tenths)
    }

    /// The GB figure as a float for JSON answers, never compared: to the nearest millionth of a GB (about
    /// a kilobyte), so that 2.2 GB read from a request reads back as 2.2.
    pub fn as_gb_f64(self) -> f64 {
        (self.0 as f64 / GB as f64 * 1e6).round() / 1e6
    }

    /// `share` of these bytes, rounded down.
    pub fn share(self, share: BasisPoints) -> Bytes {
        Bytes((u128::from(self.0) * u128::from(share.0) / 10_000) as u64)
    }
}

impl Add for Bytes {
    type Output = Bytes;
    fn add(self, rhs: Bytes) -> Bytes {
        Bytes(self.0 + rhs.0)
    }
}

impl AddAssign for Bytes {
    fn add_assign(&mut self, rhs: Bytes) {
        self.0 += rhs.0;
    }
}

impl Sub for Bytes {
    type Output = Bytes;
    fn sub(self, rhs: Bytes) -> Bytes {
        Bytes(self.0 - rhs.0)
    }
}

impl std::iter::Sum for Bytes {
    fn sum<I: Iterator<Item = Bytes>>(iter: I) -> Bytes {
        iter.fold(Bytes::ZERO, Add::add)
    }
}

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} GB", self.gb_text())
    }
}

/// `tenths` of a GB as the seed writes GB: `7`, `6.5`.
fn tenths_text(tenths: u128) -> String {
    let (whole, tenth) = (tenths / 10, tenths % 10);
    if tenth == 0 {
        whole.to_string()
    } else {
        format!("{whole}.{tenth}")
    }
}

/// A share in hundredths of a percent: 100 % is 10 000, so 33.33 + 33.33 + 33.34 is exactly 100.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct BasisPoints(pub u32);

impl BasisPoints {
    /// No share.
    pub const ZERO: BasisPoints = BasisPoints(0);
    /// All of one accelerator.
    pub const WHOLE: BasisPoints = BasisPoints(10_000);
    /// Above this total the Free row warns: the engines need room of their own.
    pub const WARN_ABOVE: BasisPoints = BasisPoints(9_000);
    /// The largest single share a field accepts (1000 %): more is a typo, and the total refuses it anyway.
    pub const MAX: BasisPoints = BasisPoints(100_000);

    /// A whole percentage.
    pub const fn percent(p: u32) -> BasisPoints {
        BasisPoints(p * 100)
    }

    /// Reads a share as a person types it: `25`, `33.33`, `7.5`, optionally ending in `%`.
    /// An empty field is `Ok(None)`: the member has no explicit share.
    pub fn parse_percent(text: &str) -> Result<Option<BasisPoints>, UnitError> {
        let text = text.trim();
        let text = text.strip_suffix('%').unwrap_or(text).trim_end();
        if text.is_empty() {
            return Ok(None);
        }
        if text.starts_with('-') {
            return Err(UnitError::Negative);
        }
        let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
        let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if (whole.is_empty() && frac.is_empty()) || !digits(whole) || !digits(frac) {
            return Err(UnitError::NotAPercentage);
        }
        if frac.len() > 2 {
            return Err(UnitError::TooPrecise);
        }
        let whole = whole.trim_start_matches('0');
        if whole.len() > 4 {
            return Err(UnitError::TooLarge);
        }
        let whole: u32 = if whole.is_empty() {
            0
        } else {
            whole.parse().map_err(|_| UnitError::NotAPercentage)?
        };
        let mut hundredths: u32 = if frac.is_empty() {
            0
        } else {
            frac.parse().map_err(|_| UnitError::NotAPercentage)?
        };
        if frac.len() == 1 {
            hundredths *= 10;
        }
        let bp = BasisPoints(whole * 100 + hundredths);
        if bp > BasisPoints::MAX {
            return Err(UnitError::TooLarge);
        }
        Ok(Some(bp))
    }

    /// Reads a percentage from a JSON number (such as `33.33`), rounded to hundredths once.
    pub fn from_percent(p: f64) -> Result<BasisPoints, UnitError> {
        if !p.is_finite() {
            return Err(UnitError::NotANumber);
        }
        if p < 0.0 {
            return Err(UnitError::Negative);
        }
        let bp = (p * 100.0).round();
        if bp > f64::from(BasisPoints::MAX.0) {
            return Err(UnitError::TooLarge);
        }
        Ok(BasisPoints(bp as u32))
    }

    /// The share as a number of basis points.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// How far past one whole accelerator, where it is past it: the part of a plan that cannot fit.
    pub fn over(self) -> Option<BasisPoints> {
        self.0
            .checked_sub(Self::WHOLE.0)
            .filter(|&over| over > 0)
            .map(BasisPoints)
    }

    /// What is left of one accelerator after this total (zero when over).
    pub fn free(self) -> BasisPoints {
        BasisPoints(BasisPoints::WHOLE.0.saturating_sub(self.0))
    }

    /// The share as a plain percentage for a form field: `25`, `33.33`, `7.5`.
    pub fn percent_text(self) -> String {
        let (whole, frac) = (self.0 / 100, self.0 % 100);
        match frac {
            0 => whole.to_string(),
            f if f % 10 == 0 => format!("{whole}.{}", f / 10),
            f => format!("{whole}.{f:02}"),
        }
    }

    /// The share of `part` in `whole`, rounded down; zero when `whole` is zero.
    pub fn ratio(part: Bytes, whole: Bytes) -> BasisPoints {
        if whole.0 == 0 {
            return BasisPoints::ZERO;
        }
        BasisPoints((u128::from(part.0) * 10_000 / u128::from(whole.0)) as u32)
    }

    /// The share of `part` in `whole`, rounded up (what holds `part` whole); the whole when `whole` is
    /// zero.
    pub fn ratio_up(part: Bytes, whole: Bytes) -> BasisPoints {
        if whole.0 == 0 {
            return BasisPoints::WHOLE;
        }
        BasisPoints(
            (u128::from(part.0) * 10_000)
                .div_ceil(u128::from(whole.0))
                .min(u128::from(u32::MAX)) as u32,
        )
    }

    /// The percentage as a float, for JSON answers only; never compared.
    pub fn as_percent_f64(self) -> f64 {
        f64::from(self.0) / 100.0
    }
}

impl Add for BasisPoints {
    type Output = BasisPoints;
    fn add(self, rhs: BasisPoints) -> BasisPoints {
        BasisPoints(self.0.saturating_add(rhs.0))
    }
}

impl std::iter::Sum for BasisPoints {
    fn sum<I: Iterator<Item = BasisPoints>>(iter: I) -> BasisPoints {
        iter.fold(BasisPoints::ZERO, Add::add)
    }
}

impl fmt::Display for BasisPoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}%", self.percent_text())
    }
}

/// A number from a request or a form field that cannot stand for memory or a share.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum UnitError {
    /// NaN or infinity.
    #[error("is not a number")]
    NotANumber,
    /// Below zero.
    #[error("is negative")]
    Negative,
    /// Beyond any real GPU or share.
    #[error("is too large")]
    TooLarge,
    /// A fraction where a whole number belongs.
    #[error("is not a whole number")]
    NotWhole,
    /// Text that is not a percentage.
    #[error("is not a percentage; enter one such as 25 or 33.33")]
    NotAPercentage,
    /// More than two decimals.
    #[error("has more than two decimals; enter one such as 33.33")]
    TooPrecise,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_rounded_up_to_basis_points_holds_all_of_it_and_no_point_more() {
        let gpu = Bytes(80_000_000_000);
        // 1.2 GB of 80 is 150 points exactly; a byte more needs a point more.
        assert_eq!(
            BasisPoints::ratio_up(Bytes(1_200_000_000), gpu),
            BasisPoints(150)
        );
        assert_eq!(
            BasisPoints::ratio_up(Bytes(1_200_000_001), gpu),
            BasisPoints(151)
        );
        assert_eq!(
            BasisPoints::ratio(Bytes(1_200_000_001), gpu),
            BasisPoints(150)
        );
        assert_eq!(BasisPoints::ratio_up(Bytes(0), gpu), BasisPoints::ZERO);
        assert_eq!(
            BasisPoints::ratio_up(Bytes(1), Bytes(0)),
            BasisPoints::WHOLE
        );
    }

    #[test]
    fn a_size_under_a_gb_is_shown_in_mb_rounded_up_and_a_larger_one_in_gb() {
        assert_eq!(Bytes(10_315_040).size_text(), "10 MB");
        assert_eq!(Bytes(1).size_text(), "1 MB");
        assert_eq!(Bytes::ZERO.size_text(), "0 GB");
        assert_eq!(Bytes::gb(1).size_text(), "1 GB");
        assert_eq!(Bytes::from_gb(6.5).unwrap().size_text(), "6.5 GB");
    }

    #[test]
    fn gb_is_shown_with_one_decimal_and_no_trailing_zero() {
        assert_eq!(Bytes::gb(7).gb_text(), "7");
        assert_eq!(Bytes::from_gb(6.5).unwrap().gb_text(), "6.5");
        assert_eq!(Bytes::from_gb(2.2).unwrap().gb_text(), "2.2");
        assert_eq!(Bytes::from_gb(0.04).unwrap().gb_text(), "0");
        assert_eq!(Bytes::from_gb(179.96).unwrap().gb_text(), "180");
        assert_eq!(Bytes::gb(8).to_string(), "8 GB");
    }

    #[test]
    fn an_engine_s_gb_figure_never_exceeds_its_share_but_for_a_share_s_rounding_to_bytes() {
        assert_eq!(Bytes::from_gb(179.96).unwrap().gb_text_at_most(), "179.9");
        assert_eq!(Bytes::from_gb(38.35).unwrap().gb_text_at_most(), "38.3");
        assert_eq!(Bytes::from_gb(2.2).unwrap().gb_text_at_most(), "2.2");
        assert_eq!(
            Bytes::gb(96)
                .share(BasisPoints::percent(30))
                .gb_text_at_most(),
            "28.8"
        );
        assert_eq!(Bytes::gb(7).gb_text_at_most(), "7");
    }

    #[test]
    fn a_share_under_a_tenth_of_a_gb_reaches_the_engine_as_millionths_never_as_nothing() {
        assert_eq!(Bytes(82 << 20).gb_text_at_most(), "0.080078");
        assert_eq!(Bytes(GB / 16).gb_text_at_most(), "0.0625");
        assert_eq!(Bytes::ZERO.gb_text_at_most(), "0");
        let share = Bytes(82 << 20);
        let read: f64 = share.gb_text_at_most().parse().unwrap();
        assert!(
            read > 0.0 && read * GB as f64 <= share.get() as f64,
            "never over"
        );
    }

    #[test]
    fn a_gb_figure_is_rounded_to_whole_bytes_once() {
        assert_eq!(Bytes::from_gb(2.5).unwrap(), Bytes(2_684_354_560));
        assert_eq!(Bytes::from_gb(1.0).unwrap(), Bytes(GB));
    }

    #[test]
    fn a_gb_figure_reads_back_as_it_was_written() {
        assert_eq!(Bytes::from_gb(2.2).unwrap().as_gb_f64(), 2.2);
        assert_eq!(Bytes::from_gb(0.8).unwrap().as_gb_f64(), 0.8);
        assert_eq!(Bytes::gb(141).as_gb_f64(), 141.0);
    }

    #[test]
    fn nonsense_memory_figures_are_refused() {
        assert_eq!(Bytes::from_gb(f64::NAN), Err(UnitError::NotANumber));
        assert_eq!(Bytes::from_gb(f64::INFINITY), Err(UnitError::NotANumber));
        assert_eq!(Bytes::from_gb(-1.0), Err(UnitError::Negative));
        assert_eq!(Bytes::from_gb(1e12), Err(UnitError::TooLarge));
    }

    #[test]
    fn thirds_of_a_share_add_up_to_exactly_one_hundred_percent() {
        let parts = ["33.33", "33.33", "33.34"];
        let total: BasisPoints = parts
            .iter()
            .map(|p| BasisPoints::parse_percent(p).unwrap().unwrap())
            .sum();
        assert_eq!(total, BasisPoints::WHOLE);
    }

    #[test]
    fn percentages_are_read_as_typed() {
        let read = |s| BasisPoints::parse_percent(s);
        assert_eq!(read("25"), Ok(Some(BasisPoints(2500))));
        assert_eq!(read(" 7.5 % "), Ok(Some(BasisPoints(750))));
        assert_eq!(read(".5"), Ok(Some(BasisPoints(50))));
        assert_eq!(read("0"), Ok(Some(BasisPoints(0))));
        assert_eq!(read(""), Ok(None));
        assert_eq!(read("  "), Ok(None));
        assert_eq!(read("abc"), Err(UnitError::NotAPercentage));
        assert_eq!(read("1.2.3"), Err(UnitError::NotAPercentage));
        assert_eq!(read("."), Err(UnitError::NotAPercentage));
        assert_eq!(read("-5"), Err(UnitError::Negative));
        assert_eq!(read("12.345"), Err(UnitError::TooPrecise));
        assert_eq!(read("99999999"), Err(UnitError::TooLarge));
        assert_eq!(read("1000.01"), Err(UnitError::TooLarge));
    }

    #[test]
    fn percentages_are_shown_without_trailing_zeros() {
        assert_eq!(BasisPoints(8500).to_string(), "85%");
        assert_eq!(BasisPoints(3333).to_string(), "33.33%");
        assert_eq!(BasisPoints(9050).to_string(), "90.5%");
        assert_eq!(BasisPoints(5).to_string(), "0.05%");
    }

    #[test]
    fn a_json_percentage_is_rounded_to_hundredths_once() {
        assert_eq!(BasisPoints::from_percent(33.33), Ok(BasisPoints(3333)));
        assert_eq!(
            BasisPoints::from_percent(f64::NAN),
            Err(UnitError::NotANumber)
        );
        assert_eq!(BasisPoints::from_percent(-0.5), Err(UnitError::Negative));
    }

    #[test]
    fn a_share_of_memory_rounds_down() {
        assert_eq!(Bytes::gb(8).share(BasisPoints::percent(25)), Bytes::gb(2));
        assert_eq!(
            BasisPoints::ratio(Bytes::gb(2), Bytes::gb(8)),
            BasisPoints(2500)
        );
        assert_eq!(
            BasisPoints::ratio(Bytes::gb(2), Bytes::ZERO),
            BasisPoints::ZERO
        );
    }

    proptest::proptest! {
        #[test]
        fn a_share_typed_back_from_its_text_is_the_same_share(bp in 0u32..=100_000) {
            let bp = BasisPoints(bp);
            proptest::prop_assert_eq!(BasisPoints::parse_percent(&bp.percent_text()), Ok(Some(bp)));
        }
    }
}
