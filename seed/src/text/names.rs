//! Who the dataset's rows are about and what they are called: people's names, in the patterns
//! a South-East Asian contact list mixes, their personal and work emails, and the names of the
//! tenants (with a mail domain each) and of their inboxes.

use std::sync::LazyLock;

use rand::Rng;
use rand::seq::IndexedRandom;

use super::pick_str;

/// Given names, one a line: the long lists are data, kept in text files beside this one. Each
/// list is picked from by index with the seeded generator, so the files' lines and their order
/// are part of the dataset.
static FIRST: LazyLock<Vec<&str>> = LazyLock::new(|| include_str!("first_names.txt").lines().collect());
/// Family names, one a line.
static LAST: LazyLock<Vec<&str>> = LazyLock::new(|| include_str!("last_names.txt").lines().collect());

/// Chinese given names, for the surname-first pattern. Its first twelve are in `FIRST` too, in
/// the same order: each list keeps its own members and order, as the dataset depends on both.
const CHINESE_GIVEN: &[&str] = &[
    "Wei Ming",
    "Mei Ling",
    "Jia Hui",
    "Kah Wai",
    "Li Ting",
    "Zhi Hao",
    "Xin Yi",
    "Jun Jie",
    "Siew Lan",
    "Chee Keong",
    "Hui Min",
    "Kok Leong",
    "Yi Xuan",
    "Zi Han",
    "Boon Huat",
];
const CHINESE_SURNAMES: &[&str] =
    &["Tan", "Lim", "Lee", "Wong", "Ng", "Chan", "Ong", "Goh", "Chong", "Teo", "Yap", "Low", "Chua", "Koh", "Leong"];
const MALAY_MALE: &[&str] =
    &["Ahmad", "Muhammad", "Hafiz", "Amir", "Faizal", "Haziq", "Irfan", "Syafiq", "Danial", "Razak", "Ismail", "Yusof"];
const MALAY_FEMALE: &[&str] =
    &["Nur", "Siti", "Aisyah", "Farah", "Nurul", "Zainab", "Izzati", "Hanis", "Aina", "Sofea"];

const MAIL_DOMAINS: &[(&str, u32)] = &[
    ("gmail.com", 40),
    ("yahoo.com", 12),
    ("hotmail.com", 10),
    ("outlook.com", 8),
    ("icloud.com", 5),
    ("live.com", 2),
    ("proton.me", 2),
    ("ymail.com", 1),
];
const COMPANY_WORDS: &[&str] = &[
    "maju",
    "jaya",
    "sinar",
    "global",
    "pacific",
    "harbour",
    "lotus",
    "summit",
    "kopi",
    "bunga",
    "nusantara",
    "delta",
    "orient",
    "apex",
    "mega",
    "prima",
    "citra",
    "straits",
    "emerald",
    "tiger",
];
const COMPANY_SUFFIXES: &[&str] = &["com.my", "com", "com.sg", "co.id", "my", "co"];

const TENANT_PREFIXES: &[&str] = &[
    "Northwind",
    "Kopi",
    "Bunga",
    "Lotus",
    "Harbour",
    "Summit",
    "Sinar",
    "Nusantara",
    "Straits",
    "Emerald",
    "Tiger",
    "Orient",
    "Pacific",
    "Apex",
    "Citra",
    "Mega",
    "Prima",
    "Delta",
    "Jaya",
    "Borneo",
    "Penang",
    "Melaka",
    "Cahaya",
    "Rimba",
    "Selat",
];
const TENANT_SUFFIXES: &[&str] = &[
    "Traders",
    "Retail",
    "Telco",
    "Travel",
    "Clinic",
    "Logistics",
    "Insurance",
    "Foods",
    "Fashion",
    "Electronics",
    "Property",
    "Academy",
    "Motors",
    "Pharmacy",
    "Realty",
    "Air",
    "Bank",
    "Cafe",
    "Home",
    "Mart",
];

/// Folds a name to the letters an email address would use for it.
fn mail_part(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        let folded = match ch {
            'é' | 'è' | 'ë' => 'e',
            'ö' | 'ø' => 'o',
            'ü' => 'u',
            'ñ' => 'n',
            'ł' | 'Ł' => 'l',
            'ç' => 'c',
            c if c.is_ascii_alphanumeric() => c.to_ascii_lowercase(),
            _ => continue,
        };
        out.push(folded);
    }
    out
}

/// A person's display name and the parts an email would be made of.
#[derive(Debug, Clone)]
pub(crate) struct Person {
    pub(crate) name: String,
    pub(crate) first: &'static str,
    pub(crate) last: &'static str,
}

/// A contact's or agent's name, in one of the patterns a real contact list mixes.
pub(crate) fn person(rng: &mut impl Rng) -> Person {
    let pick = |rng: &mut _, list: &'static [&'static str]| *list.choose(rng).unwrap_or(&"Alex");
    let p: f64 = rng.random();
    if p < 0.50 {
        let (first, last) = (pick(rng, &FIRST), pick(rng, &LAST));
        Person { name: format!("{first} {last}"), first, last }
    } else if p < 0.62 {
        let female = rng.random_bool(0.5);
        let first = if female { pick(rng, MALAY_FEMALE) } else { pick(rng, MALAY_MALE) };
        let father = pick(rng, MALAY_MALE);
        let link = if female { "binti" } else { "bin" };
        Person { name: format!("{first} {link} {father}"), first, last: father }
    } else if p < 0.72 {
        let (last, first) = (pick(rng, CHINESE_SURNAMES), pick(rng, CHINESE_GIVEN));
        Person { name: format!("{last} {first}"), first, last }
    } else if p < 0.80 {
        let first = pick(rng, &FIRST);
        Person { name: first.to_owned(), first, last: "" }
    } else if p < 0.85 {
        let (first, last) = (pick(rng, &FIRST), pick(rng, &LAST));
        Person { name: format!("{} {}", first.to_lowercase(), last.to_lowercase()), first, last }
    } else if p < 0.93 {
        let (first, last) = (pick(rng, &FIRST), pick(rng, &LAST));
        let initial = char::from(b'A' + rng.random_range(0..26u8));
        Person { name: format!("{first} {initial}. {last}"), first, last }
    } else if p < 0.97 {
        let (first, last, other) = (pick(rng, &FIRST), pick(rng, &LAST), pick(rng, &LAST));
        Person { name: format!("{first} {last}-{other}"), first, last }
    } else {
        let (first, last) = (pick(rng, &FIRST), pick(rng, &LAST));
        Person { name: format!("{} {}", first.to_uppercase(), last.to_uppercase()), first, last }
    }
}

/// A personal email address for a contact (a mail provider or a small company's domain).
pub(crate) fn contact_email(rng: &mut impl Rng, who: &Person) -> String {
    let first = mail_part(who.first);
    let last = mail_part(who.last);
    let local = match (rng.random_range(0..7u8), last.is_empty()) {
        (_, true) => format!("{first}{}", rng.random_range(1..10_000u32)),
        (0 | 1, false) => format!("{first}.{last}"),
        (2, false) => format!("{first}{last}"),
        (3, false) => format!("{first}_{last}{}", rng.random_range(1..100u32)),
        (4, false) => format!("{}{last}", first.chars().next().unwrap_or('x')),
        (5, false) => format!("{first}{}", rng.random_range(70..100u32)),
        _ => format!("{last}.{first}"),
    };
    let domain = if rng.random_bool(0.2) {
        format!("{}{}.{}", pick_str(rng, COMPANY_WORDS), pick_str(rng, COMPANY_WORDS), pick_str(rng, COMPANY_SUFFIXES))
    } else {
        weighted(rng, MAIL_DOMAINS).to_owned()
    };
    let email = format!("{local}@{domain}");
    if rng.random_bool(0.05) { capitalise(&email) } else { email }
}

/// A work email for an agent at the tenant's domain.
pub(crate) fn work_email(who: &Person, n: usize, domain: &str) -> String {
    let first = mail_part(who.first);
    let last = mail_part(who.last);
    if last.is_empty() { format!("{first}{n}@{domain}") } else { format!("{first}.{last}{n}@{domain}") }
}

/// `count` distinct tenant names ("Lotus Pharmacy"), with a mail domain for each.
pub(crate) fn tenant_names(rng: &mut impl Rng, count: usize) -> Vec<(String, String)> {
    let mut all: Vec<(usize, usize)> =
        (0..TENANT_PREFIXES.len()).flat_map(|p| (0..TENANT_SUFFIXES.len()).map(move |s| (p, s))).collect();
    rand::seq::SliceRandom::shuffle(&mut all[..], rng);
    (0..count)
        .map(|i| {
            let (p, s) = all[i % all.len()];
            let round = i / all.len();
            let (prefix, suffix) = (TENANT_PREFIXES[p], TENANT_SUFFIXES[s]);
            let name =
                if round == 0 { format!("{prefix} {suffix}") } else { format!("{prefix} {suffix} {}", round + 1) };
            let domain = format!(
                "{}{}.example",
                mail_part(prefix),
                if round == 0 { mail_part(suffix) } else { format!("{}{round}", mail_part(suffix)) }
            );
            (name, domain)
        })
        .collect()
}

/// An inbox's name and channel, the `i`th of its tenant.
pub(crate) fn inbox(i: usize) -> (String, &'static str) {
    const INBOXES: &[(&str, &str)] = &[
        ("Website chat", "web"),
        ("WhatsApp Support", "whatsapp"),
        ("Support email", "email"),
        ("WhatsApp Sales", "whatsapp"),
        ("SMS alerts", "sms"),
        ("Mobile app", "api"),
        ("Billing email", "email"),
        ("Website chat (BM)", "web"),
        ("Partners API", "api"),
        ("Returns", "email"),
        ("VIP WhatsApp", "whatsapp"),
        ("Store pickup SMS", "sms"),
    ];
    let (name, channel) = INBOXES[i % INBOXES.len()];
    let round = i / INBOXES.len();
    if round == 0 { (name.to_owned(), channel) } else { (format!("{name} {}", round + 1), channel) }
}

fn weighted(rng: &mut impl Rng, list: &'static [(&'static str, u32)]) -> &'static str {
    let total: u32 = list.iter().map(|(_, w)| w).sum();
    let mut x = rng.random_range(0..total);
    for (item, w) in list {
        if x < *w {
            return item;
        }
        x -= w;
    }
    list[0].0
}

fn capitalise(s: &str) -> String {
    let mut chars = s.chars();
    chars.next().map(|c| c.to_ascii_uppercase().to_string() + chars.as_str()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn emails_are_plausible_addresses() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        for _ in 0..10_000 {
            let who = person(&mut rng);
            assert!(!who.name.is_empty() && who.name.chars().count() <= 200);
            let email = contact_email(&mut rng, &who);
            let (local, domain) = email.split_once('@').expect("an @");
            assert!(!local.is_empty() && domain.contains('.'), "{email}");
            assert!(email.is_ascii() && email.len() <= 320, "{email}");
        }
    }

    #[test]
    fn the_name_files_hold_one_name_a_line() {
        for list in [&FIRST, &LAST] {
            assert!(list.len() >= 50, "a list of {} names", list.len());
            for name in list.iter() {
                assert!(!name.is_empty() && name.trim() == *name && !name.contains('"'), "{name:?}");
            }
        }
    }

    #[test]
    fn tenant_names_are_distinct() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let names = tenant_names(&mut rng, 1_200);
        let distinct: std::collections::HashSet<_> = names.iter().map(|(n, _)| n).collect();
        assert_eq!(distinct.len(), names.len());
    }
}
