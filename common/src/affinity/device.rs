//! Device names and priority strings.
//!
//! Grammar (whitespace around `,` is ignored):
//!
//! ```text
//! priority := [ "HETERO:" ] device { "," device }
//! device   := [ host "/" ] name [ "." index ]
//! host     := (letter | digit) { letter | digit | "-" | "_" | "." }
//! name     := upper { upper | digit | "_" }
//! index    := digit { digit }
//! ```
//!
//! Examples: `HETERO:GPU,CPU`, `GPU.1,CPU`, `HETERO:node-a/GPU.0,node-b/CPU`.
//! A device may appear once in a priority list.

use std::fmt;

/// A device: `[host/]NAME[.index]`, e.g. `node-a/GPU.0`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId {
    pub host: Option<String>,
    pub name: String,
    pub index: Option<u32>,
}

impl DeviceId {
    /// Parses one device name.
    pub fn parse(s: &str) -> Result<DeviceId, DeviceParseError> {
        let mut p = Parser { input: s, pos: 0 };
        let d = p.device()?;
        p.end()?;
        Ok(d)
    }

    /// The device kind without host and index, e.g. `GPU`.
    pub fn kind(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(h) = &self.host {
            write!(f, "{h}/")?;
        }
        f.write_str(&self.name)?;
        if let Some(i) = self.index {
            write!(f, ".{i}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for DeviceId {
    type Err = DeviceParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DeviceId::parse(s)
    }
}

/// An ordered device priority list, e.g. from `HETERO:GPU,CPU`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DevicePriority {
    pub devices: Vec<DeviceId>,
}

impl DevicePriority {
    pub fn parse(s: &str) -> Result<DevicePriority, DeviceParseError> {
        let mut p = Parser { input: s, pos: 0 };
        if s.starts_with("HETERO:") {
            p.pos = "HETERO:".len();
        } else if let Some(colon) = s.find(':') {
            return Err(p.error_at(colon, "only the HETERO: prefix is allowed before ':'"));
        }
        let mut devices: Vec<DeviceId> = Vec::new();
        loop {
            p.skip_spaces();
            let start = p.pos;
            let d = p.device()?;
            if devices.contains(&d) {
                return Err(p.error_at(start, &format!("device {d} is listed twice")));
            }
            devices.push(d);
            p.skip_spaces();
            if p.peek() == Some(',') {
                p.pos += 1;
                continue;
            }
            p.end()?;
            break;
        }
        Ok(DevicePriority { devices })
    }

    /// Position of `device` in the list.
    pub fn position(&self, device: &DeviceId) -> Option<usize> {
        self.devices.iter().position(|d| d == device)
    }
}

impl fmt::Display for DevicePriority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self.devices.iter().map(|d| d.to_string()).collect();
        write!(f, "HETERO:{}", names.join(","))
    }
}

impl std::str::FromStr for DevicePriority {
    type Err = DeviceParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DevicePriority::parse(s)
    }
}

/// A malformed device or priority string, with the position of the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid device string at position {position}: {message}\n  {input}\n  {caret}")]
pub struct DeviceParseError {
    pub input: String,
    /// Character offset of the problem.
    pub position: usize,
    pub message: String,
    caret: String,
}

struct Parser<'a> {
    input: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<char> {
        self.input[self.pos..].chars().next()
    }

    fn skip_spaces(&mut self) {
        while self.peek() == Some(' ') {
            self.pos += 1;
        }
    }

    fn error_at(&self, byte_pos: usize, message: &str) -> DeviceParseError {
        let position = self.input[..byte_pos.min(self.input.len())].chars().count();
        DeviceParseError {
            input: self.input.to_string(),
            position,
            message: message.to_string(),
            caret: format!("{}^", " ".repeat(position)),
        }
    }

    fn end(&self) -> Result<(), DeviceParseError> {
        match self.peek() {
            None => Ok(()),
            Some(c) => Err(self.error_at(
                self.pos,
                &format!("unexpected '{c}', expected ',' or the end"),
            )),
        }
    }

    fn take_while(&mut self, f: impl Fn(char) -> bool) -> &str {
        let start = self.pos;
        while let Some(c) = self.peek() {
            if !f(c) {
                break;
            }
            self.pos += c.len_utf8();
        }
        &self.input[start..self.pos]
    }

    fn device(&mut self) -> Result<DeviceId, DeviceParseError> {
        let start = self.pos;
        let first = self
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            .to_string();
        let mut host = None;
        let name_start;
        if self.peek() == Some('/') {
            if first.is_empty() || !first.starts_with(|c: char| c.is_ascii_alphanumeric()) {
                return Err(self.error_at(start, "a host name must start with a letter or digit"));
            }
            host = Some(first);
            self.pos += 1;
            name_start = self.pos;
            self.take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.'));
        } else {
            name_start = start;
        }
        let word = &self.input[name_start..self.pos];
        let (name, index) = match word.split_once('.') {
            Some((n, i)) => (n, Some(i)),
            None => (word, None),
        };
        if name.is_empty() {
            let at = if self.pos < self.input.len() {
                self.pos
            } else {
                name_start
            };
            return Err(self.error_at(at, "expected a device name such as CPU or GPU"));
        }
        if !name.starts_with(|c: char| c.is_ascii_uppercase())
            || !name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        {
            return Err(self.error_at(
                name_start,
                &format!(
                    "device name '{name}' must be upper case letters, digits or '_' (e.g. GPU)"
                ),
            ));
        }
        let index = match index {
            None => None,
            Some(i) => {
                let at = name_start + name.len() + 1;
                if i.is_empty() || !i.chars().all(|c| c.is_ascii_digit()) {
                    return Err(self.error_at(at, &format!("device index '{i}' must be a number")));
                }
                Some(
                    i.parse()
                        .map_err(|_| self.error_at(at, "device index is too large"))?,
                )
            }
        };
        Ok(DeviceId {
            host,
            name: name.to_string(),
            index,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_priority_strings() {
        let p = DevicePriority::parse("HETERO:GPU,CPU").unwrap();
        assert_eq!(p.devices.len(), 2);
        assert_eq!(p.to_string(), "HETERO:GPU,CPU");
        let p = DevicePriority::parse("HETERO:GPU.1, CPU").unwrap();
        assert_eq!(p.devices[0].index, Some(1));
        let p = DevicePriority::parse("node-a/GPU.0,node-b.lan/CPU").unwrap();
        assert_eq!(p.devices[0].host.as_deref(), Some("node-a"));
        assert_eq!(p.devices[1].to_string(), "node-b.lan/CPU");
        assert_eq!(p.to_string(), "HETERO:node-a/GPU.0,node-b.lan/CPU");
    }

    #[test]
    fn rejects_bad_strings_with_positions() {
        let cases = [
            ("HETERO:GPU,,CPU", 11),
            ("HETERO:gpu,CPU", 7),
            ("HETERO:GPU.x,CPU", 11),
            ("HETERO:GPU,CPU,GPU", 15),
            ("MULTI:GPU", 5),
            ("HETERO:GPU;CPU", 10),
            ("HETERO:", 7),
            ("/GPU", 0),
            ("HETERO:GPU,", 11),
        ];
        for (input, pos) in cases {
            let e = DevicePriority::parse(input).unwrap_err();
            assert_eq!(e.position, pos, "{input}: {e}");
            assert!(e.to_string().contains('^'), "{e}");
        }
    }
}
