//! `CUDA_VISIBLE_DEVICES`: which of the host's GPUs a process sees, in which order.
//!
//! Rules (as the driver applies them): unset means every GPU in host order; an empty value
//! means none. Otherwise a comma-separated list, enumerated in list order (ordinal 0 is the
//! first entry). An entry is a decimal host index, a full GPU UUID (`GPU-…`) or a unique
//! prefix of one (compared case-insensitively, at least one character after `GPU-`).
//! Surrounding whitespace is ignored. The first entry that is invalid (an index out of range,
//! a negative or non-numeric index, a UUID or prefix that names no GPU or several GPUs, or a
//! GPU already listed) ends the list: the entries before it stay visible.

use abi::GpuUuid;

/// Host indices visible to a process whose `CUDA_VISIBLE_DEVICES` is `value`.
#[must_use]
pub fn visible_indices(value: Option<&str>, host: &[GpuUuid]) -> Vec<usize> {
    let Some(value) = value else {
        return (0..host.len()).collect();
    };
    let mut out: Vec<usize> = Vec::new();
    if value.trim().is_empty() {
        return out;
    }
    for entry in value.split(',') {
        let entry = entry.trim();
        let index = if entry
            .get(..4)
            .is_some_and(|p| p.eq_ignore_ascii_case("GPU-"))
        {
            let hits: Vec<usize> = (0..host.len())
                .filter(|&i| host[i].has_text_prefix(entry))
                .collect();
            match hits.as_slice() {
                [one] => Some(*one),
                _ => None,
            }
        } else if !entry.is_empty() && entry.bytes().all(|b| b.is_ascii_digit()) {
            entry.parse::<usize>().ok().filter(|&i| i < host.len())
        } else {
            None
        };
        match index {
            Some(i) if !out.contains(&i) => out.push(i),
            _ => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn host() -> Vec<GpuUuid> {
        [
            "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6",
            "GPU-8932f938-0000-0000-0000-000000000000",
            "GPU-11111111-2222-3333-4444-555555555555",
        ]
        .iter()
        .map(|s| GpuUuid::parse(s).unwrap())
        .collect()
    }

    #[test]
    fn unset_empty_and_index_forms() {
        let h = host();
        assert_eq!(visible_indices(None, &h), vec![0, 1, 2]);
        assert_eq!(visible_indices(Some(""), &h), Vec::<usize>::new());
        assert_eq!(visible_indices(Some("2,0"), &h), vec![2, 0]);
        assert_eq!(visible_indices(Some(" 1 , 2 "), &h), vec![1, 2]);
        // An invalid index ends the list.
        assert_eq!(visible_indices(Some("0,2,-1,1"), &h), vec![0, 2]);
        assert_eq!(visible_indices(Some("0,7,1"), &h), vec![0]);
        assert_eq!(visible_indices(Some("x"), &h), Vec::<usize>::new());
        // A repeated device ends the list.
        assert_eq!(visible_indices(Some("1,1,2"), &h), vec![1]);
    }

    #[test]
    fn uuid_and_prefix_forms() {
        let h = host();
        assert_eq!(
            visible_indices(Some("GPU-11111111-2222-3333-4444-555555555555,0"), &h),
            vec![2, 0]
        );
        assert_eq!(visible_indices(Some("GPU-1111"), &h), vec![2]);
        assert_eq!(visible_indices(Some("gpu-8932F937"), &h), vec![0]);
        // Ambiguous prefix (both 8932f93x GPUs) ends the list at once.
        assert_eq!(
            visible_indices(Some("GPU-8932f93,1"), &h),
            Vec::<usize>::new()
        );
        assert_eq!(visible_indices(Some("2,GPU-ffff"), &h), vec![2]);
        assert_eq!(visible_indices(Some("GPU-"), &h), Vec::<usize>::new());
    }

    proptest! {
        #[test]
        fn result_is_a_duplicate_free_prefix_of_valid_entries(s in "[0-9GPU,a-f -٫é]{0,40}") {
            let h = host();
            let v = visible_indices(Some(&s), &h);
            prop_assert!(v.len() <= h.len());
            let mut seen = std::collections::HashSet::new();
            for i in &v {
                prop_assert!(*i < h.len());
                prop_assert!(seen.insert(*i));
            }
        }
    }
}
