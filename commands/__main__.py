from mule.commands.main import entry

entry()
