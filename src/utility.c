/*
 * utility.c — utility commands and the extension: what none may do to its
 * objects, and what they need from it first.
 *
 * Every table of the extension belongs to the extension's owner, so that no
 * role can attach code to them that the SECURITY DEFINER functions would run
 * with that owner's rights (docs/OPERATIONS.md: Roles).  Two commands would undo that
 * even when a superuser runs them: a GRANT of TRIGGER (attach triggers),
 * REFERENCES (foreign keys that hold prune() up) or TRUNCATE on those tables
 * -- a dump of a version before 0.4.0 carries one, GRANT ALL to the
 * history's then owner -- and a change of an object's owner.  Both are
 * refused outside the extension's own scripts.
 *
 * And the kept writers (rowwrite.c) hold the state tables open: they are
 * closed before any utility command, so that DROP, ALTER or TRUNCATE of a
 * table does not find it open in this session -- after the states folded
 * and not written yet are written (state.c).
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "commands/extension.h"
#include "nodes/parsenodes.h"
#include "tcop/utility.h"
#include "utils/lsyscache.h"

#include "status_history.h"

static ProcessUtility_hook_type next_utility = NULL;

/* Is the relation rv names one of the extension's (in its schema)? */
static bool
ours(RangeVar *rv, Oid schema)
{
	Oid			relid = RangeVarGetRelid(rv, NoLock, true);

	return OidIsValid(relid) && get_rel_namespace(relid) == schema;
}

/* Does a GRANT give what lets a role attach code to a table, hold prune() up, or empty it? */
static bool
grants_code(GrantStmt *stmt)
{
	ListCell   *lc;

	if (stmt->privileges == NIL)
		return true;			/* ALL */
	foreach(lc, stmt->privileges)
	{
		AccessPriv *priv = (AccessPriv *) lfirst(lc);

		if (priv->priv_name == NULL ||
			strcmp(priv->priv_name, "trigger") == 0 ||
			strcmp(priv->priv_name, "references") == 0 ||
			strcmp(priv->priv_name, "truncate") == 0)
			return true;
	}
	return false;
}

/* A GRANT ON TABLE of those privileges on the extension's tables: refused. */
static void
check_grant(GrantStmt *stmt, Oid schema)
{
	bool		targets = false;
	ListCell   *lc;

	if (!stmt->is_grant || stmt->objtype != OBJECT_TABLE || !grants_code(stmt))
		return;
	foreach(lc, stmt->objects)
	{
		if (stmt->targtype == ACL_TARGET_OBJECT)
			targets |= ours((RangeVar *) lfirst(lc), schema);
		else if (stmt->targtype == ACL_TARGET_ALL_IN_SCHEMA)
			targets |= strcmp(strVal(lfirst(lc)), SH_SCHEMA) == 0;
	}
	if (targets)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("TRIGGER, REFERENCES and TRUNCATE on the tables of status_history are granted to no role"),
				 errdetail("A role holding them could attach code that the extension's functions run with its owner's rights, hold prune() up, or empty the history."),
				 errhint("Grant what a role needs by name (SELECT, INSERT), or run status_history.grant_roles(); after restoring a dump of a version before 0.4.0, run status_history.grant_roles().")));
}

/* A change of owner of the extension's schema or of an object in it: refused. */
static void
check_owner(Node *stmt, Oid schema)
{
	bool		targets = false;

	if (IsA(stmt, AlterTableStmt))
	{
		AlterTableStmt *alter = (AlterTableStmt *) stmt;
		ListCell   *lc;

		foreach(lc, alter->cmds)
			if (((AlterTableCmd *) lfirst(lc))->subtype == AT_ChangeOwner)
				targets |= ours(alter->relation, schema);
	}
	else if (IsA(stmt, AlterOwnerStmt))
	{
		AlterOwnerStmt *alter = (AlterOwnerStmt *) stmt;

		if (alter->objectType == OBJECT_SCHEMA)
			targets = strcmp(strVal(alter->object), SH_SCHEMA) == 0;
		else if (alter->objectType == OBJECT_FUNCTION || alter->objectType == OBJECT_PROCEDURE ||
				 alter->objectType == OBJECT_ROUTINE)
		{
			List	   *names = ((ObjectWithArgs *) alter->object)->objname;

			targets = list_length(names) == 2 && strcmp(strVal(linitial(names)), SH_SCHEMA) == 0;
		}
	}
	if (targets)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("the objects of status_history belong to the extension's owner"),
				 errdetail("Their owner could attach code that the extension's functions run with the extension owner's rights."),
				 errhint("Leave them to the extension's owner; grant roles their parts with status_history.grant_roles().")));
}

static void
sh_utility(PlannedStmt *pstmt, const char *queryString, bool readOnlyTree,
		   ProcessUtilityContext context, ParamListInfo params,
		   QueryEnvironment *queryEnv, DestReceiver *dest, QueryCompletion *qc)
{
	Node	   *stmt = pstmt->utilityStmt;

	if (!creating_extension && (IsA(stmt, GrantStmt) || IsA(stmt, AlterTableStmt) ||
								IsA(stmt, AlterOwnerStmt)))
	{
		Oid			schema = get_namespace_oid(SH_SCHEMA, true);

		/*
		 * Only once the extension is there: a restore creates (and gives
		 * away) its schema before CREATE EXTENSION, with the library
		 * preloaded too.
		 */
		if (OidIsValid(schema) && OidIsValid(get_extension_oid("status_history", true)))
		{
			if (IsA(stmt, GrantStmt))
				check_grant((GrantStmt *) stmt, schema);
			else
				check_owner(stmt, schema);
		}
	}
	/* What the last statement folded is written first; the writers are closed. */
	sh_state_flush();
	sh_rowwriter_release();
	(next_utility ? next_utility : standard_ProcessUtility) (pstmt, queryString, readOnlyTree,
															 context, params, queryEnv, dest, qc);
}

void
sh_utility_init(void)
{
	next_utility = ProcessUtility_hook;
	ProcessUtility_hook = sh_utility;
}
