//! Subscription-group administration: UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200),
//! GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201), GET_SUBSCRIPTIONGROUP_CONFIG (352),
//! DELETE_SUBSCRIPTIONGROUP (207), and the group lookup with auto-creation every consumer
//! request goes through.

use std::rc::Rc;

use crate::body::SubscriptionGroupConfig;
use crate::broker::Broker;
use crate::error::RequestError;
use crate::remoting::RemotingCommand;
use crate::server::Connection;

impl Broker {
    /// The group's config for a consumer request, auto-created on first use.
    pub(crate) fn consumer_group_config(
        &self,
        group: &str,
    ) -> Result<SubscriptionGroupConfig, RequestError> {
        self.groups
            .borrow_mut()
            .find_or_create(group)
            .ok_or_else(|| {
                RequestError::SubscriptionGroupNotExist(format!(
                    "subscription group [{group}] does not exist and cannot be created here"
                ))
            })
    }
}

impl Broker {
    pub(crate) fn update_and_create_subscription_group(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let config = SubscriptionGroupConfig::parse(request.body)?;
        self.groups.borrow_mut().upsert(config)?;
        let file = self.groups.borrow().persisted().clone();
        self.answer_when_durable(file.clone(), file.latest(), connection, request);
        Ok(())
    }
}

impl Broker {
    pub(crate) fn all_subscription_group_config(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let body = self.groups.borrow().snapshot().encode();
        connection.respond_body(request, &body);
        Ok(())
    }
}

impl Broker {
    pub(crate) fn get_subscription_group_config(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let group = request.ext_fields.required("group")?;
        let body = match self.groups.borrow().get(group) {
            Some(config) => config.encode(),
            None => {
                return Err(RequestError::SubscriptionGroupNotExist(format!(
                    "subscription group [{group}] does not exist"
                )))
            }
        };
        connection.respond_body(request, &body);
        Ok(())
    }
}

impl Broker {
    /// DELETE_SUBSCRIPTIONGROUP: ext groupName, cleanOffset (drop the group's offsets too).
    pub(crate) fn delete_subscription_group(
        &self,
        request: &RemotingCommand<'_>,
        connection: &Rc<Connection>,
    ) -> Result<(), RequestError> {
        let ext = &request.ext_fields;
        let group = ext.required("groupName")?;
        if !self.groups.borrow_mut().remove(group) {
            return Err(RequestError::SubscriptionGroupNotExist(format!(
                "subscription group [{group}] does not exist"
            )));
        }
        if ext.bool_lenient("cleanOffset") == Some(true) {
            self.offsets.borrow_mut().remove_group(group);
        }
        let file = self.groups.borrow().persisted().clone();
        self.answer_when_durable(file.clone(), file.latest(), connection, request);
        Ok(())
    }
}
