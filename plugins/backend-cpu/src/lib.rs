//! Prima's CPU backend plugin.
