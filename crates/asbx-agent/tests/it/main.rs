//! Integration tests of the agent: the real loop, in process, against a fake
//! gateway on a Unix socket and the mock provider on 127.0.0.1; no jail.

mod harness;

mod anthropic;
mod bootstrap;
mod client_tools;
mod egress;
mod faults;
mod files;
mod limits;
mod mcp;
mod openai;
mod protocol;
mod scripted;
mod skills;
mod workspace;
