//! remoting (to be written)
