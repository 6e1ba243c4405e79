//! store (to be written)
