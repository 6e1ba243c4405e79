//! Store administration: DELETE_EXPIRED_COMMITLOG (329, `mqadmin deleteExpiredCommitLog`) and
//! TRIGGER_DELETE_FILES (27). Both start RocketMQ's manual deletion: the next
//! `MANUAL_DELETE_RUNS` retention passes of this shard run whatever the hour (expired
//! segments go; unexpired ones only while the disk is past diskSpaceCleanForciblyRatio), the
//! first one at once. Answered SUCCESS as soon as it is asked, as a Java broker does; the
//! deletions show in the log and in GET_BROKER_RUNTIME_INFO (`commitLogMinOffset`).

use std::rc::Rc;

use crate::broker::Broker;
use crate::error::RequestError;
use crate::remoting::{response_code, RemotingCommand};
use crate::server::Connection;

impl Broker {
    pub(crate) fn delete_expired_files(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        log::info!(
            "{}: manual deletion of expired commitlog files asked (request code {})",
            self.identity.broker_name,
            request.code
        );
        self.retention.trigger_manual();
        connection.respond(request, response_code::SUCCESS, None);
        Ok(())
    }
}
