//! Message bodies: sentences from a contact's, an agent's or the system's repertoire, their
//! `{slots}` filled with plausible orders, products, places and dates, at a realistic length
//! for who sent them.

use rand::Rng;
use rand_distr::{Distribution, LogNormal};

use super::pick_str;
use crate::enums::Sender;

const PRODUCTS: &[&str] = &[
    "the blue sneakers",
    "the 65\" TV",
    "my phone case",
    "the rice cooker",
    "the baju kurung",
    "the prepaid plan",
    "the gift card",
    "the air fryer",
    "the travel insurance",
    "the king-size mattress",
    "the protein powder",
    "my new SIM card",
    "the dining set",
    "the school bag",
    "the durian mooncakes",
    "the wireless earbuds",
];
const CITIES: &[&str] = &[
    "Kuala Lumpur",
    "Petaling Jaya",
    "Penang",
    "Johor Bahru",
    "Ipoh",
    "Kota Kinabalu",
    "Kuching",
    "Melaka",
    "Singapore",
    "Jakarta",
    "Bangkok",
    "Manila",
    "Ho Chi Minh City",
    "Shah Alam",
    "Seremban",
];
const COURIERS: &[&str] = &["J&T", "Pos Laju", "DHL", "Ninja Van", "GDex", "City-Link", "Lalamove"];
const MONTHS: &[&str] = &["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

const SHORT_REPLIES: &[&str] = &[
    "ok",
    "Ok thanks",
    "thank you!",
    "yes",
    "no",
    "hello?",
    "👍",
    "sure",
    "noted",
    "alright, thanks 🙏",
    "terima kasih",
    "ok noted",
    "can you check?",
    "any update?",
    "Hi",
    "Hello",
    "still waiting",
    "got it",
    "🙏🙏",
    "ya",
    "not yet",
    "done",
    "ok tq",
    "thanks a lot!",
    "how long?",
];

const CONTACT_SENTENCES: &[&str] = &[
    "Hi, I ordered {product} last week and it still hasn't arrived.",
    "Hello! Is {product} still available?",
    "My order number is {order}.",
    "Can I change the delivery address to {city}?",
    "I was charged twice for order {order}, please check.",
    "What time do you close today?",
    "Do you deliver to {city}?",
    "The tracking link says delivered but I didn't receive anything.",
    "How much is the shipping to {city}?",
    "I'd like a refund for {product}, it arrived damaged.",
    "Can I pay by instalments?",
    "The app keeps logging me out when I try to check out.",
    "Is there any promotion this weekend?",
    "I need the invoice for {order} for my company claim.",
    "My parcel is stuck with {courier} since {date}.",
    "Can I exchange {product} for a bigger size?",
    "Why was my card declined? I have enough balance.",
    "I want to cancel my subscription.",
    "Please call me back, my number is 01{phone}.",
    "Is the {city} branch open on public holidays?",
    "I reset my password but the code never came.",
    "The item I received is not the one in the picture.",
    "Can you hold the stock for me until Friday?",
    "How do I update my IC number in the account?",
    "Saya nak tanya pasal order {order}.",
    "Boleh hantar ke {city} tak?",
];

const AGENT_SENTENCES: &[&str] = &[
    "Hi there, thanks for reaching out! Let me check that for you.",
    "I can see order {order} was shipped on {date} via {courier}.",
    "I've raised a refund of RM{amount}; it should reach your account within 5-7 working days.",
    "Could you share a photo of the item and your order number?",
    "Our stores are open from 10am to 10pm daily, including public holidays.",
    "Is there anything else I can help you with?",
    "Sorry for the wait, we're handling a high volume of messages today.",
    "I've updated the delivery address to {city}.",
    "The courier will attempt delivery again tomorrow between 9am and 6pm.",
    "Yes, we deliver to {city}; shipping is RM{amount} and takes 2-3 working days.",
    "I've escalated this to our billing team and they will get back to you within 24 hours.",
    "Please try logging out and in again, then clear the app's cache.",
    "The double charge is a pre-authorisation and will be released by your bank automatically.",
    "I've sent the invoice for {order} to your registered email.",
    "Your subscription has been cancelled and you won't be charged from next month.",
    "We're sorry about the damaged item; a replacement is on its way.",
    "Our current promotion is 15% off with the code RAYA15 until the end of the month.",
    "For your security, please don't share your full card number here.",
    "I'm transferring you to a colleague in the returns team who can help with this.",
    "Thank you for your patience!",
    "The exchange is approved; please drop the item at any branch with the receipt.",
    "We've reset the verification; you should receive a new code by SMS within a few minutes.",
];

const SYSTEM_MESSAGES: &[&str] = &[
    "Conversation was assigned to an agent.",
    "Conversation was marked as resolved.",
    "Conversation was reopened by the contact.",
    "Customer rated the conversation {rating}/5.",
    "Auto-reply: we have received your message and will reply within 1 business day.",
    "Conversation was transferred to another team.",
    "Contact is outside business hours; an away message was sent.",
    "Conversation was snoozed until tomorrow 9:00.",
];

/// Appends a sentence with its `{slots}` filled with plausible values.
fn fill(rng: &mut impl Rng, template: &str, out: &mut String) {
    use std::fmt::Write as _;
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let Some(len) = rest[start..].find('}') else { break };
        let slot = &rest[start + 1..start + len];
        // Writing to a String cannot fail.
        let _ = match slot {
            "product" => write!(out, "{}", pick_str(rng, PRODUCTS)),
            "city" => write!(out, "{}", pick_str(rng, CITIES)),
            "courier" => write!(out, "{}", pick_str(rng, COURIERS)),
            "order" => write!(out, "#MY{:08}", rng.random_range(0..100_000_000u32)),
            "date" => write!(out, "{} {}", rng.random_range(1..29u32), pick_str(rng, MONTHS)),
            "amount" => write!(out, "{}.{:02}", rng.random_range(5..900u32), rng.random_range(0..100u32)),
            "phone" => write!(out, "{}-{:07}", rng.random_range(0..10u32), rng.random_range(0..10_000_000u32)),
            "rating" => write!(out, "{}", rng.random_range(1..=5u32)),
            other => write!(out, "{other}"),
        };
        rest = &rest[start + len + 1..];
    }
    out.push_str(rest);
}

/// A message body of a realistic length for who sent it: most chat messages are a sentence or
/// two, contacts send many one-word replies, agents sometimes paste a long policy paragraph.
pub(crate) fn body(rng: &mut impl Rng, sender: Sender, out: &mut String) {
    out.clear();
    match sender {
        Sender::System => {
            let template = pick_str(rng, SYSTEM_MESSAGES);
            fill(rng, template, out);
        }
        Sender::Contact | Sender::Agent => {
            let (median, pool) = match sender {
                Sender::Contact => (40.0_f64, CONTACT_SENTENCES),
                _ => (60.0, AGENT_SENTENCES),
            };
            if sender == Sender::Contact && rng.random_bool(0.25) {
                out.push_str(pick_str(rng, SHORT_REPLIES));
                return;
            }
            let lengths = LogNormal::new(median.ln(), 0.8).expect("finite parameters");
            let target = length(lengths.sample(rng)).min(3_000);
            loop {
                let template = pick_str(rng, pool);
                fill(rng, template, out);
                if out.len() >= target {
                    break;
                }
                out.push(if rng.random_bool(0.15) { '\n' } else { ' ' });
            }
        }
    }
}

/// A sampled length in characters (the sample is positive and bounded by the caller).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn length(x: f64) -> usize {
    if x.is_finite() && x > 0.0 { x as usize } else { 1 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn bodies_fit_the_schema() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        for sender in [Sender::Contact, Sender::Agent, Sender::System] {
            let mut b = String::new();
            for _ in 0..5_000 {
                body(&mut rng, sender, &mut b);
                let n = b.chars().count();
                assert!((1..=10_000).contains(&n), "{n}");
                assert!(!b.contains('{'), "{b}");
            }
        }
    }
}
