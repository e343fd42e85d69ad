//! Slurm's compressed host lists (`SLURM_STEP_NODELIST`, `SLURM_JOB_NODELIST`) and task counts
//! (`SLURM_STEP_TASKS_PER_NODE`), as `scontrol show hostnames` expands them.
//!
//! A host list is comma-separated names; a name may hold bracketed groups of comma-separated
//! numbers and ranges, each group multiplying the names (`rack[1-2]-n[01-02]` is four hosts),
//! and a range keeps the zero padding of its lower bound (`n[08-10]` is `n08 n09 n10`). As in
//! Slurm 22.05, nothing may follow a name's last bracket group (`gpu[1-2]-ib` is refused).
//! Task counts are comma-separated numbers, each optionally repeated: `2(x3),1` is 2, 2, 2, 1.

use crate::error::{Error, Result};

/// Hosts a range may expand to, at most (a typo such as `n[1-99999999]` is an error, not an
/// allocation of gigabytes).
const MAX_HOSTS: usize = 1 << 20;

/// Expands a Slurm host list into host names, in order.
///
/// ```
/// use barewire::cluster::expand_hostlist;
/// assert_eq!(
///     expand_hostlist("n[08-10],rack[1-2]-gpu[1,3],login").unwrap(),
///     ["n08", "n09", "n10", "rack1-gpu1", "rack1-gpu3", "rack2-gpu1", "rack2-gpu3", "login"]
/// );
/// ```
pub fn expand_hostlist(list: &str) -> Result<Vec<String>> {
    let mut hosts = Vec::new();
    for name in split_top(list)? {
        if name.is_empty() {
            continue;
        }
        expand_name(name, &mut hosts)?;
    }
    Ok(hosts)
}

/// Splits at commas outside brackets.
fn split_top(list: &str) -> Result<Vec<&str>> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in list.char_indices() {
        match c {
            '[' => {
                if depth > 0 {
                    return Err(bad(list, "nested brackets"));
                }
                depth += 1;
            }
            ']' => {
                if depth == 0 {
                    return Err(bad(list, "a ']' without its '['"));
                }
                depth -= 1;
            }
            ',' if depth == 0 => {
                out.push(list[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(bad(list, "a '[' without its ']'"));
    }
    out.push(list[start..].trim());
    Ok(out)
}

fn bad(list: &str, why: &str) -> Error {
    Error::Invalid(format!("host list {list:?}: {why}"))
}

/// One name with any number of bracket groups: the product of the groups, left to right.
fn expand_name(name: &str, out: &mut Vec<String>) -> Result<()> {
    let mut names = vec![String::new()];
    let mut rest = name;
    while let Some(open) = rest.find('[') {
        let close = rest[open..]
            .find(']')
            .map(|c| open + c)
            .ok_or_else(|| bad(name, "a '[' without its ']'"))?;
        let prefix = &rest[..open];
        let items = expand_group(&rest[open + 1..close], name)?;
        let mut next = Vec::with_capacity(names.len() * items.len());
        for n in &names {
            for it in &items {
                next.push(format!("{n}{prefix}{it}"));
            }
        }
        if next.len() > MAX_HOSTS {
            return Err(bad(name, "expands to more than a million hosts"));
        }
        names = next;
        rest = &rest[close + 1..];
    }
    if !rest.is_empty() && rest.len() != name.len() {
        // As Slurm's own parser (22.05): text after the last bracket group is not a host list.
        return Err(bad(name, &format!("{rest:?} after the last ']'")));
    }
    for mut n in names {
        n.push_str(rest);
        out.push(n);
        if out.len() > MAX_HOSTS {
            return Err(bad(name, "expands to more than a million hosts"));
        }
    }
    Ok(())
}

/// `1,3,08-10` -> `1 3 08 09 10`.
fn expand_group(group: &str, name: &str) -> Result<Vec<String>> {
    let mut items = Vec::new();
    for part in group.split(',') {
        let part = part.trim();
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (lo, hi),
            None => (part, part),
        };
        let num = |s: &str| -> Result<u64> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(name, &format!("{part:?} is not a number or a range")));
            }
            s.parse()
                .map_err(|_| bad(name, &format!("{s} is too large")))
        };
        let (a, b) = (num(lo)?, num(hi)?);
        if b < a {
            return Err(bad(name, &format!("the range {part} runs backwards")));
        }
        if (b - a) as usize >= MAX_HOSTS {
            return Err(bad(name, "expands to more than a million hosts"));
        }
        let width = if lo.len() > 1 && lo.starts_with('0') {
            lo.len()
        } else {
            0
        };
        for v in a..=b {
            items.push(format!("{v:0width$}"));
        }
    }
    Ok(items)
}

/// Expands Slurm's tasks-per-node list: `2(x3),1` -> `[2, 2, 2, 1]`.
///
/// ```
/// use barewire::cluster::expand_tasks_per_node;
/// assert_eq!(expand_tasks_per_node("2(x3),1").unwrap(), [2, 2, 2, 1]);
/// ```
pub fn expand_tasks_per_node(list: &str) -> Result<Vec<usize>> {
    let mut out = Vec::new();
    for part in list.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (n, times) = match part.split_once("(x") {
            Some((n, rest)) => {
                let t = rest
                    .strip_suffix(')')
                    .ok_or_else(|| bad(list, &format!("{part:?}: a '(x' without its ')'")))?;
                (n, t)
            }
            None => (part, "1"),
        };
        let parse = |s: &str| {
            s.parse::<usize>()
                .map_err(|_| bad(list, &format!("{part:?} is not N or N(xM)")))
        };
        let (n, times) = (parse(n)?, parse(times)?);
        if out.len() + times > MAX_HOSTS {
            return Err(bad(list, "more than a million nodes"));
        }
        out.extend(std::iter::repeat_n(n, times));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(s: &str) -> Vec<String> {
        expand_hostlist(s).unwrap()
    }

    #[test]
    fn slurms_documented_forms_expand() {
        assert_eq!(ex("tux[0-3]"), ["tux0", "tux1", "tux2", "tux3"]);
        assert_eq!(ex("tux[1,3-4,7]"), ["tux1", "tux3", "tux4", "tux7"]);
        assert_eq!(ex("n[08-11]"), ["n08", "n09", "n10", "n11"]);
        assert_eq!(ex("n[098-101]"), ["n098", "n099", "n100", "n101"]);
        assert_eq!(ex("n[9-11]"), ["n9", "n10", "n11"]);
        assert_eq!(
            ex("rack[1-2]-n[01-02]"),
            ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]
        );
        assert_eq!(ex("login,gpu[1-2]"), ["login", "gpu1", "gpu2"]);
        assert_eq!(ex("n[1-003]"), ["n1", "n2", "n3"]);
        assert_eq!(ex("n[07,8-9]"), ["n07", "n8", "n9"]);
        assert_eq!(ex("localhost"), ["localhost"]);
        assert_eq!(ex(""), Vec::<String>::new());
        assert_eq!(ex("a, b"), ["a", "b"]);
    }

    #[test]
    fn malformed_lists_are_errors_naming_the_problem() {
        for (s, why) in [
            ("n[1-3", "without its ']'"),
            ("n1-3]", "without its '['"),
            ("n[[1]]", "nested"),
            ("n[3-1]", "backwards"),
            ("n[a-b]", "not a number"),
            ("n[1-]", "not a number"),
            ("n[0-99999999]", "million"),
            ("gpu[1,3]-ib", "after the last"),
        ] {
            let e = expand_hostlist(s).unwrap_err().to_string();
            assert!(e.contains(why), "{s}: {e}");
        }
    }

    #[test]
    fn tasks_per_node_expand() {
        assert_eq!(expand_tasks_per_node("3").unwrap(), [3]);
        assert_eq!(expand_tasks_per_node("2(x3),1").unwrap(), [2, 2, 2, 1]);
        assert_eq!(expand_tasks_per_node("1,4(x2)").unwrap(), [1, 4, 4]);
        assert!(expand_tasks_per_node("2(x3").is_err());
        assert!(expand_tasks_per_node("x").is_err());
    }
}
