//! protocol (to be written)
