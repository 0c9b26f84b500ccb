//! The benchmark's report: the plans under docs/explain/, and the timings' section of
//! docs/explain/README.md beside them (the hand-written findings at its end kept).

use std::fmt::Write as _;
use std::time::Duration;

use super::cases::{Case, Subject};
use super::erasures::Erasures;
use super::measure::{Timing, ms};
use breakwater_domain::DEFAULT_PAGE_SIZE;

use crate::rig::services::root;

pub(super) struct Report<'a> {
    /// Timed and untimed runs of each query.
    pub(super) runs: usize,
    pub(super) warmup: usize,
    pub(super) started: chrono::DateTime<chrono::Utc>,
    pub(super) load_before: String,
    pub(super) subjects: &'a [Subject],
    pub(super) cases: &'a [Case],
    pub(super) timings: &'a [Timing],
    pub(super) erasures: &'a [(usize, Erasures)],
}

pub(super) const SECTION: &str = "## Query latency on the skewed seed";

impl Report<'_> {
    pub(super) async fn write(&self) -> anyhow::Result<()> {
        let root = root();
        let dir = root.join("docs/explain");
        std::fs::create_dir_all(&dir)?;
        for (case, timing) in self.cases.iter().zip(self.timings) {
            std::fs::write(dir.join(format!("{}.txt", case.key)), &timing.explain)?;
        }
        for (i, e) in self.erasures {
            std::fs::write(dir.join(format!("{}-erasure.txt", self.subjects[*i].key)), &e.total.explain)?;
        }
        let path = dir.join("README.md");
        let current = std::fs::read_to_string(&path).unwrap_or_else(|_| "# The API's queries\n".to_owned());
        std::fs::write(&path, replace_section(&current, SECTION, &self.markdown()))?;
        println!("wrote docs/explain/");
        Ok(())
    }

    #[allow(clippy::too_many_lines)]
    pub(super) fn markdown(&self) -> String {
        let mut s = String::new();
        let load = self.load_before.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
        let _ = writeln!(s, "{SECTION}\n");
        let _ = writeln!(
            s,
            "Measured by `cargo xtask bench-queries` on {} (load average {load} at the start), release build. \
             Each query is a `breakwater_domain` function, exactly as the API calls it, on one connection \
             with sqlx's prepared-statement cache: {} untimed runs, then {} timed ones, client-measured \
             over loopback. Page size {}. Plans: `EXPLAIN (ANALYZE, BUFFERS)` of the same statements, from \
             `auto_explain`, in this directory; the command fails if one scans `conversations`, \
             `messages` or `contacts` sequentially.\n",
            self.started.format("%Y-%m-%d"),
            self.warmup,
            self.runs,
            DEFAULT_PAGE_SIZE
        );
        for sub in self.subjects {
            let _ = writeln!(
                s,
                "- **{}** (`{}`): {} conversations, {} messages, {} contacts; longest conversation {} messages; \
                 biggest contact {} conversations.",
                sub.label,
                sub.key,
                sub.conversations,
                sub.messages,
                sub.contacts,
                sub.long_conversation.1,
                sub.big_contacts.first().map_or(0, |c| c.1)
            );
        }
        let big = self.subjects.first().map_or("", |x| x.label.as_str());
        let small = self.subjects.get(1).map_or("", |x| x.label.as_str());
        let _ = writeln!(s, "\n| query | {big} p50 ms | p99 ms | {small} p50 ms | p99 ms | plan |");
        let _ = writeln!(s, "|---|--:|--:|--:|--:|---|");
        let per_subject = self.cases.iter().filter(|c| c.subject == 0).count();
        for k in 0..per_subject {
            let (c0, t0) = (&self.cases[k], &self.timings[k]);
            let other = self.cases.iter().zip(self.timings).find(|(c, _)| {
                c.subject == 1 && c.key.trim_start_matches("small-") == c0.key.trim_start_matches("big-")
            });
            let (p50, p99, plan1) = other.map_or((String::new(), String::new(), String::new()), |(c, t)| {
                (ms(t.p50), ms(t.p99), format!(", [small]({}.txt)", c.key))
            });
            let _ = writeln!(
                s,
                "| {} | {} | {} | {p50} | {p99} | [big]({}.txt){plan1}{} |",
                c0.title.replace('|', "/"),
                ms(t0.p50),
                ms(t0.p99),
                c0.key,
                if t0.seq_scan || other.is_some_and(|(_, t)| t.seq_scan) { " **seq scan**" } else { "" }
            );
        }
        for (i, e) in self.erasures {
            let sub = &self.subjects[*i];
            let (lo, hi) = e.sizes.iter().fold((i64::MAX, 0), |(lo, hi), (c, _)| (lo.min(*c), hi.max(*c)));
            let msgs: i64 = e.sizes.first().map_or(0, |x| x.1);
            let _ = writeln!(
                s,
                "| erasure, {}: request + erase job, {} contacts of {lo}-{hi} conversations (largest: {hi} \
                 conversations, {msgs} messages, {} ms) | {} | {} | | | [{}]({}-erasure.txt) |",
                sub.label,
                e.sizes.len(),
                ms(e.largest),
                ms(e.total.p50),
                ms(e.total.p99),
                sub.key,
                sub.key
            );
            let _ = writeln!(
                s,
                "| &nbsp;&nbsp;of which the request (tombstone + job) | {} | {} | | | |",
                ms(e.request.p50),
                ms(e.request.p99)
            );
        }
        s.push_str(&self.goals());
        let _ = writeln!(
            s,
            "\nTo reproduce (the bench seeds an empty database with the full default itself; it erases \
             contacts and puts them back afterwards):\n\n```sh\ncargo run --release -p breakwater-seed -- \
             --database-url postgres://postgres@127.0.0.1:5432/breakwater_bench --reset\ncargo xtask \
             bench-queries --database-url postgres://postgres@127.0.0.1:5432/breakwater_bench\n```"
        );
        s
    }

    pub(super) fn goals(&self) -> String {
        let big: Vec<(&Case, &Timing)> = self.cases.iter().zip(self.timings).filter(|(c, _)| c.subject == 0).collect();
        let worst = |prefix: &str, deep: Option<bool>| {
            big.iter()
                .filter(|(c, _)| c.key.starts_with(prefix) && deep.is_none_or(|d| c.key.ends_with("-deep") == d))
                .map(|(_, t)| t.p50)
                .max()
                .unwrap_or_default()
        };
        let inbox = worst("big-inbox", Some(false));
        let inbox_deep = worst("big-inbox", Some(true));
        let contacts = worst("big-contacts", None);
        let erasure = self.erasures.first().map(|(_, e)| e.total.p50).unwrap_or_default();
        let request = self.erasures.first().map(|(_, e)| e.request.p50).unwrap_or_default();
        let largest = self.erasures.first().map(|(_, e)| e.largest).unwrap_or_default();
        let verdict = |ok: bool| if ok { "met" } else { "**missed**" };
        let mut s = String::new();
        let _ = writeln!(s, "\nGoals on the 55% tenant (worst p50 of each group):\n");
        let _ = writeln!(s, "| goal | measured | |\n|---|--:|---|");
        let _ = writeln!(
            s,
            "| inbox page 1, every filter, <= 2 ms p50 | {} ms | {} |",
            ms(inbox),
            verdict(inbox <= Duration::from_millis(2))
        );
        let _ = writeln!(
            s,
            "| deep inbox pages as fast as page 1 | {} ms | {} |",
            ms(inbox_deep),
            verdict(inbox_deep <= inbox + inbox / 2 + Duration::from_micros(200))
        );
        let _ = writeln!(
            s,
            "| contacts list and searches <= 3 ms p50 (issue: 2 ms) | {} ms | {} |",
            ms(contacts),
            verdict(contacts <= Duration::from_millis(3))
        );
        let _ = writeln!(
            s,
            "| erasure request (the API's `DELETE`: tombstone + job) <= 50 ms | {} ms | {} |",
            ms(request),
            verdict(request <= Duration::from_millis(50))
        );
        let _ = writeln!(
            s,
            "| erasure, request + the job's deletion, <= 50 ms (p50 over the biggest contacts; the largest alone: {} ms) | {} ms | {} |",
            ms(largest),
            ms(erasure),
            verdict(erasure <= Duration::from_millis(50))
        );
        s
    }
}

/// The hand-written part of the section, kept when the measurements are rewritten.
pub(super) const FINDINGS: &str = "\n### Findings";

/// Replaces the `## heading` section of a Markdown document (up to the next `## `), or appends it;
/// a `### Findings` subsection at its end is kept.
pub(super) fn replace_section(doc: &str, heading: &str, section: &str) -> String {
    let kept = doc
        .find(&format!("\n{heading}\n"))
        .map(|start| {
            let body = &doc[start + 1..];
            let end = body[heading.len()..].find("\n## ").map_or(body.len(), |i| heading.len() + i + 1);
            let body = &body[..end];
            body.find(FINDINGS).map_or("", |f| body[f..].trim_end())
        })
        .unwrap_or_default()
        .to_owned();
    let section = format!("{}{}{kept}", section.trim_end(), if kept.is_empty() { "" } else { "\n" });
    let section = section.as_str();
    match doc.find(&format!("\n{heading}\n")) {
        Some(start) => {
            let body = start + 1;
            let end = doc[body + heading.len()..].find("\n## ").map_or(doc.len(), |i| body + heading.len() + i + 1);
            format!("{}{section}\n{}{}", &doc[..body], if end < doc.len() { "\n" } else { "" }, &doc[end..])
        }
        None => format!("{}\n\n{section}\n", doc.trim_end()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_are_replaced_or_appended() {
        let doc = "# Performance\n\n## Seeding\n\nfast\n";
        let added = replace_section(doc, SECTION, "## Query latency on the skewed seed\n\nv1\n");
        assert_eq!(added, "# Performance\n\n## Seeding\n\nfast\n\n## Query latency on the skewed seed\n\nv1\n");
        let again = replace_section(&added, SECTION, "## Query latency on the skewed seed\n\nv2");
        assert_eq!(again, "# Performance\n\n## Seeding\n\nfast\n\n## Query latency on the skewed seed\n\nv2\n");
        let noted = format!("{again}\n### Findings\n\nnotes\n");
        let renewed = replace_section(&noted, SECTION, "## Query latency on the skewed seed\n\nv4");
        assert!(renewed.contains("v4\n\n### Findings\n\nnotes\n") && !renewed.contains("v2"), "{renewed}");
        let middle = format!("{again}\n## Later\n\nkept\n");
        let replaced = replace_section(&middle, SECTION, "## Query latency on the skewed seed\n\nv3");
        assert!(replaced.contains("v3\n\n## Later\n\nkept\n") && !replaced.contains("v2"), "{replaced}");
    }
}
