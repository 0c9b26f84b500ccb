//! The lab's progress lines, on stderr (stdout carries the summary and the files written).

pub(super) fn log(msg: &str) {
    eprintln!("lab: {msg}");
}
