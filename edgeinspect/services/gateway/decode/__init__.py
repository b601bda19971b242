"""The decoder stages as the gateway drives them: live routes and bans, the stage stream, recovery, re-planning."""
