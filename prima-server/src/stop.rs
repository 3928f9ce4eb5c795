//! Stop strings over streamed text: text is released only once it can no longer be the
//! start of a stop string, so a client never sees part of one.

/// Watches streamed text for the first occurrence of any stop string.
pub(crate) struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not released: it may be the beginning of a stop string.
    held: String,
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub(crate) fn new(stops: &[String]) -> StopMatcher {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    /// Adds `piece`; returns the text that is now safe to release and whether a stop
    /// string was found (the text before it is released, the rest dropped).
    pub(crate) fn push(&mut self, piece: &str) -> (String, bool) {
        if self.stops.is_empty() {
            return (piece.to_string(), false);
        }
        self.held.push_str(piece);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, true);
        }
        // Hold back the longest tail of `held` that some stop string begins with.
        let keep_from = self
            .held
            .char_indices()
            .map(|(i, _)| i)
            .find(|&i| {
                let tail = &self.held[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.held.len());
        let out = self.held[..keep_from].to_string();
        self.held.drain(..keep_from);
        (out, false)
    }

    /// The text still held back, released when generation ends without a stop string.
    pub(crate) fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::StopMatcher;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for p in pieces {
            let (text, hit) = m.push(p);
            out.push_str(&text);
            if hit {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn without_stop_strings_text_passes_through() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
        assert_eq!(run(&[""], &["a", "b"]), ("ab".into(), false));
    }

    #[test]
    fn a_stop_string_split_over_pieces_is_found_and_never_released() {
        assert_eq!(
            run(&["END"], &["hello E", "N", "D more"]),
            ("hello ".into(), true)
        );
    }

    #[test]
    fn a_false_start_is_released_later() {
        let stops = vec!["END".to_string()];
        let mut m = StopMatcher::new(&stops);
        assert_eq!(m.push("abE"), ("ab".into(), false));
        assert_eq!(m.push("Nx"), ("ENx".into(), false));
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn the_earliest_of_several_stop_strings_wins() {
        assert_eq!(
            run(&["world", "lo"], &["hello world"]),
            ("hel".into(), true)
        );
    }

    #[test]
    fn multibyte_text_is_cut_on_character_boundaries() {
        assert_eq!(run(&["é!"], &["caf", "é", "é!"]), ("café".into(), true));
        assert_eq!(run(&["éx"], &["cé", "é"]), ("céé".into(), false));
    }
}
