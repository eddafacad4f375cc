from csagate.cli import main

main()
