//! broker (to be written)
