//! What text of a generation can go out, as a pure state machine: each
//! token's piece of text is added, and the text is released up to what
//! may still begin a stop string (held back until it is clear) or an
//! unfinished character; a stop string ends the generation with the text
//! before it. When the generation ends otherwise (an end-of-sequence
//! token, the token limit, a full context), whatever was held back goes
//! out.

/// One generation's text.
#[derive(Debug, Clone)]
pub struct Emitter {
    stop: Vec<String>,
    written: String,
    /// Bytes of `written` released so far.
    sent: usize,
    /// A stop string was found: nothing more goes out.
    stopped: bool,
}

/// What a piece released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Emitted {
    /// Text to send now (may be empty).
    pub text: String,
    /// A stop string was found: the generation ends here.
    pub stopped: bool,
}

impl Emitter {
    /// A generation that ends at any of `stop` (empty strings are not
    /// stop strings).
    pub fn new(stop: &[String]) -> Emitter {
        Emitter {
            stop: stop.iter().filter(|s| !s.is_empty()).cloned().collect(),
            written: String::new(),
            sent: 0,
            stopped: false,
        }
    }

    /// A token's piece of text: what can go out now.
    pub fn push(&mut self, piece: &str) -> Emitted {
        if self.stopped {
            return Emitted {
                text: String::new(),
                stopped: true,
            };
        }
        self.written.push_str(piece);
        let (text, stopped) = releasable(&self.written, self.sent, &self.stop);
        let text = text.to_string();
        self.sent += text.len();
        self.stopped = stopped;
        Emitted { text, stopped }
    }

    /// The generation ended without a stop string: what was held back
    /// (a possible start of a stop string), less an unfinished character.
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        let whole = self.written.trim_end_matches('\u{FFFD}');
        let rest = whole.get(self.sent.min(whole.len())..).unwrap_or("");
        let rest = rest.to_string();
        self.sent = self.written.len();
        rest
    }

    /// Every byte of text the generation wrote (stop strings included).
    pub fn written(&self) -> &str {
        &self.written
    }
}

/// Text that can go out now: what is new since `sent` bytes, holding back
/// an unfinished character (the replacement character a partial byte
/// sequence decodes to) and any tail that may begin a stop string. With a
/// stop string found, the text before it and `true`.
fn releasable<'a>(text: &'a str, sent: usize, stop: &[String]) -> (&'a str, bool) {
    let earliest = stop.iter().filter_map(|s| text.find(s.as_str())).min();
    if let Some(at) = earliest {
        return (text.get(sent.min(at)..at).unwrap_or(""), true);
    }
    let whole = &text[..text.trim_end_matches('\u{FFFD}').len()];
    let mut end = whole.len();
    for s in stop {
        // The longest proper prefix of `s` that the text ends with.
        let held = (1..s.len())
            .rev()
            .filter(|&n| s.is_char_boundary(n))
            .find(|&n| whole.ends_with(&s[..n]))
            .unwrap_or(0);
        end = end.min(whole.len() - held);
    }
    (text.get(sent.min(end)..end).unwrap_or(""), false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stop(s: &str) -> Vec<String> {
        vec![s.to_string()]
    }

    #[test]
    fn text_is_released_up_to_a_possible_stop_string() {
        let mut e = Emitter::new(&stop("\nUser:"));
        assert_eq!(e.push("Hello").text, "Hello");
        let held = e.push("\nUs");
        assert_eq!((held.text.as_str(), held.stopped), ("", false));
        let found = e.push("er: hi");
        assert_eq!((found.text.as_str(), found.stopped), ("", true));
        assert_eq!(e.push("more").text, "", "nothing after a stop");
        assert_eq!(e.finish(), "");
    }

    #[test]
    fn the_text_before_a_stop_string_goes_out_with_it() {
        let mut e = Emitter::new(&stop("\nUser:"));
        e.push("Hello");
        let found = e.push(" there\nUser:");
        assert_eq!((found.text.as_str(), found.stopped), (" there", true));
    }

    #[test]
    fn an_end_flushes_what_was_held_back() {
        // The generation ends (an end-of-sequence token) on text that
        // began a stop string but never finished it: it goes out.
        let mut e = Emitter::new(&stop("\nUser:"));
        assert_eq!(e.push("Bye").text, "Bye");
        assert_eq!(e.push("\nUs").text, "");
        assert_eq!(e.finish(), "\nUs");
        assert_eq!(e.finish(), "", "once");
    }

    #[test]
    fn an_unfinished_character_waits_and_is_dropped_at_the_end() {
        let mut e = Emitter::new(&[]);
        assert_eq!(e.push("caf\u{FFFD}").text, "caf");
        assert_eq!(e.finish(), "");
    }
}
