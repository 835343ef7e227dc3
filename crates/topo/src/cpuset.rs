//! A set of CPU (or NUMA node) numbers in the kernel's list format (`0-3,8,10-11`, as
//! `cpulist_parse` reads and `%*pbl` prints it).

use std::collections::BTreeSet;
use std::fmt;

use crate::TopoError;

/// CPU or node numbers, ordered.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuSet(BTreeSet<usize>);

impl CpuSet {
    /// The empty set.
    pub fn new() -> CpuSet {
        CpuSet::default()
    }

    /// Parses the kernel's list format; an empty (or all-blank) string is the empty set.
    pub fn parse_list(s: &str) -> Result<CpuSet, TopoError> {
        let bad = || TopoError::Parse(format!("{s:?} is not a CPU list"));
        let mut set = BTreeSet::new();
        for part in s.trim().split(',').filter(|p| !p.trim().is_empty()) {
            let (a, b) = match part.trim().split_once('-') {
                Some((a, b)) => (a, b),
                None => (part.trim(), part.trim()),
            };
            let a: usize = a.parse().map_err(|_| bad())?;
            let b: usize = b.parse().map_err(|_| bad())?;
            if a > b || b >= 1 << 20 {
                return Err(bad());
            }
            set.extend(a..=b);
        }
        Ok(CpuSet(set))
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: usize) -> bool {
        self.0.contains(&cpu)
    }

    /// Adds `cpu`.
    pub fn insert(&mut self, cpu: usize) {
        self.0.insert(cpu);
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the set has no member.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Members in ascending order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = usize> + '_ {
        self.0.iter().copied()
    }

    /// Members of both sets.
    pub fn intersection(&self, other: &CpuSet) -> CpuSet {
        CpuSet(self.0.intersection(&other.0).copied().collect())
    }
}

impl FromIterator<usize> for CpuSet {
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Self {
        CpuSet(iter.into_iter().collect())
    }
}

impl fmt::Display for CpuSet {
    /// The kernel's list format; the empty set prints as nothing.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut it = self.0.iter().copied().peekable();
        while let Some(start) = it.next() {
            let mut end = start;
            while it.peek() == Some(&(end + 1)) {
                end = it.next().unwrap_or(end);
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

impl serde::Serialize for CpuSet {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_round_trip() {
        for s in ["0-3,8,10-11", "0", "", "1,3,5", "0-63"] {
            assert_eq!(CpuSet::parse_list(s).unwrap().to_string(), s);
        }
        assert_eq!(CpuSet::parse_list("0-3\n").unwrap().len(), 4);
        assert_eq!(
            CpuSet::parse_list("2,0-1").unwrap().to_string(),
            "0-2",
            "merged and ordered"
        );
        for bad in ["a", "3-1", "1-", "0-99999999"] {
            assert!(CpuSet::parse_list(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn intersection() {
        let a = CpuSet::parse_list("0-3").unwrap();
        let b = CpuSet::parse_list("2-5").unwrap();
        assert_eq!(a.intersection(&b).to_string(), "2-3");
        assert!(a.intersection(&CpuSet::new()).is_empty());
    }
}
