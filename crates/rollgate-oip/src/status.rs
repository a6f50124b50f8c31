//! gRPC status codes, and the HTTP status each is counted as.

/// A gRPC status code (`grpc-status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Code {
    Ok = 0,
    Cancelled = 1,
    Unknown = 2,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    AlreadyExists = 6,
    PermissionDenied = 7,
    ResourceExhausted = 8,
    FailedPrecondition = 9,
    Aborted = 10,
    OutOfRange = 11,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    DataLoss = 15,
    Unauthenticated = 16,
}

impl Code {
    /// The code a `grpc-status` value names; a value gRPC does not define
    /// is `Unknown`, as the gRPC specification says.
    pub fn of_header(value: &[u8]) -> Code {
        let n = std::str::from_utf8(value)
            .ok()
            .and_then(|s| s.trim().parse::<u8>().ok());
        match n {
            Some(0) => Code::Ok,
            Some(1) => Code::Cancelled,
            Some(3) => Code::InvalidArgument,
            Some(4) => Code::DeadlineExceeded,
            Some(5) => Code::NotFound,
            Some(6) => Code::AlreadyExists,
            Some(7) => Code::PermissionDenied,
            Some(8) => Code::ResourceExhausted,
            Some(9) => Code::FailedPrecondition,
            Some(10) => Code::Aborted,
            Some(11) => Code::OutOfRange,
            Some(12) => Code::Unimplemented,
            Some(13) => Code::Internal,
            Some(14) => Code::Unavailable,
            Some(15) => Code::DataLoss,
            Some(16) => Code::Unauthenticated,
            _ => Code::Unknown,
        }
    }

    /// The value of a `grpc-status` header.
    pub fn as_header(self) -> &'static str {
        const VALUES: [&str; 17] = [
            "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15",
            "16",
        ];
        VALUES[self as usize]
    }

    /// The HTTP status this outcome is counted as, by the mapping of
    /// Google's API design guide (and grpc-gateway's): the caller's
    /// mistakes are 4xx, the server's failures 5xx. So a gRPC answer is
    /// judged by the same rules as a REST one.
    pub fn http_equivalent(self) -> u16 {
        match self {
            Code::Ok => 200,
            Code::Cancelled => 499,
            Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => 400,
            Code::Unauthenticated => 401,
            Code::PermissionDenied => 403,
            Code::NotFound => 404,
            Code::AlreadyExists | Code::Aborted => 409,
            Code::ResourceExhausted => 429,
            Code::Unknown | Code::Internal | Code::DataLoss => 500,
            Code::Unimplemented => 501,
            Code::Unavailable => 503,
            Code::DeadlineExceeded => 504,
        }
    }

    /// The code a gateway answers for an HTTP status of its own (a
    /// timeout, an unreachable model, a body too large), by gRPC's
    /// mapping of HTTP statuses.
    pub fn of_http(status: u16) -> Code {
        match status {
            200..=299 => Code::Ok,
            400 => Code::InvalidArgument,
            401 => Code::Unauthenticated,
            403 => Code::PermissionDenied,
            404 => Code::NotFound,
            408 | 504 => Code::DeadlineExceeded,
            413 => Code::ResourceExhausted,
            429 | 502 | 503 => Code::Unavailable,
            501 => Code::Unimplemented,
            _ => Code::Internal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_reads_back_from_its_header() {
        for n in 0..=16u8 {
            let code = Code::of_header(n.to_string().as_bytes());
            assert_eq!(code as u8, n);
            assert_eq!(code.as_header(), n.to_string());
        }
        assert_eq!(Code::of_header(b"17"), Code::Unknown);
        assert_eq!(Code::of_header(b"x"), Code::Unknown);
    }

    #[test]
    fn callers_mistakes_are_4xx_and_servers_failures_5xx() {
        for n in 1..=16u8 {
            let code = Code::of_header(n.to_string().as_bytes());
            let http = code.http_equivalent();
            let callers = matches!(
                code,
                Code::Cancelled
                    | Code::InvalidArgument
                    | Code::FailedPrecondition
                    | Code::OutOfRange
                    | Code::Unauthenticated
                    | Code::PermissionDenied
                    | Code::NotFound
                    | Code::AlreadyExists
                    | Code::Aborted
                    | Code::ResourceExhausted
            );
            assert_eq!((400..500).contains(&http), callers, "{code:?}");
            assert_eq!((500..600).contains(&http), !callers, "{code:?}");
        }
        assert_eq!(Code::Ok.http_equivalent(), 200);
        assert_eq!(Code::of_http(503), Code::Unavailable);
        assert_eq!(Code::of_http(504), Code::DeadlineExceeded);
    }
}
