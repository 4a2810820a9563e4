//! AWS: the SigV4 presigning and the credentials that both IAM logins use, the RDS / Aurora
//! database token (`postgres.auth = "aws_rds_iam"`, made in `postgres`) and the MSK token
//! (`kafka.sasl_mechanism = "AWS_MSK_IAM"`, handed to librdkafka by `sink`).
//!
//! In: the process environment, the shared profile files, and the credential endpoints
//! (STS, ECS, EC2 instance metadata). Out: credentials and presigned tokens. It imports
//! nothing of the data path (`postgres` → `aws`, `sink` → `aws`, never back).

pub mod credentials;
pub mod msk;
pub mod sigv4;

pub use credentials::{AwsCredentials, CredentialsError, CredentialsProvider};
