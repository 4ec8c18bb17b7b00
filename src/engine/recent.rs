//! What a thread worked out lately, kept for when the same input comes again: a fixed number
//! of entries, the oldest replaced first. The body check's values (`json_scan::Checked`) and
//! the spec reads (`pod_object::ReadSpecs`) are kept this way.

/// At most `N` entries, the oldest replaced first.
pub(crate) struct Recent<T, const N: usize> {
    entries: Vec<T>,
    oldest: usize,
}

impl<T, const N: usize> Default for Recent<T, N> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            oldest: 0,
        }
    }
}

impl<T, const N: usize> Recent<T, N> {
    /// The first entry `matches` takes.
    pub(crate) fn find(&self, matches: impl FnMut(&&T) -> bool) -> Option<&T> {
        self.entries.iter().find(matches)
    }

    /// Keeps `entry`, in place of the oldest once there are `N`.
    pub(crate) fn keep(&mut self, entry: T) {
        if self.entries.len() < N {
            self.entries.push(entry);
        } else {
            self.entries[self.oldest] = entry;
            self.oldest = (self.oldest + 1) % N;
        }
    }

    /// The entries kept, in no particular order.
    #[cfg(test)]
    pub(crate) fn entries(&self) -> &[T] {
        &self.entries
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_is_replaced_first_and_no_more_than_n_are_kept() {
        let mut recent = Recent::<u32, 3>::default();
        for n in 0..5 {
            recent.keep(n);
        }
        let mut kept = recent.entries().to_vec();
        kept.sort_unstable();
        assert_eq!(kept, [2, 3, 4]);
        assert_eq!(recent.find(|&&n| n > 2), Some(&3));
        assert_eq!(recent.find(|&&n| n < 2), None);
    }
}
